"""`export --kind decision2`: an upstream Decision 2.0 package -> a verified edge-runtime package.

Steps: verify the package (decision2_source.py: pointer, exact inventory, identity, config,
calibration, score bias, head names; an adapter's pinned base and LoRA contract), load the
Qwen3 backbone (a ``qwen-adapter`` has its LoRA merged, ``W + (alpha / r) B A``, and the merge is
checked against the unmerged forward), export ``Qwen3Model`` with Optimum (``last_hidden_state``,
final-normed; causal, right-padded rows), keep the candidate head as numpy data (head.npz) and
the temperatures and score bias in decision_config.json.

Parity: each check question (the Decision 2.0 golden questions and generated ones over every
type) is rendered by the server's segment code (edge_runtime.families.decision2.prompt); its
candidate logits from ONNX Runtime (rows right-padded into one batch) and the numpy head are
compared with PyTorch (each row alone) and the §1.7 head math written here in torch. Refused
above LOGIT_TOLERANCE; the answers (§1.8) must agree too.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.decision2_source import (
    LORA_FORMAT,
    MANIFEST,
    MANIFEST_SCHEMA,
    POINTER,
    PROMPT_VERSION,
    Decision2Source,
    checkpoint_files,
    read_decision2,
    safetensors_elements,
    sha256_file,
    sha256_json,
    source_files,
)
from converters.errors import ConversionError
from converters.export import ExportResult, PackageIdentity, identity_card, sanitize_name
from converters.package_writer import card_start
from converters.progress import Step, log
from edge_runtime.families.decision2.candidate import CandidateHead
from edge_runtime.families.decision2.pipeline import Decision2Assets, pad_rows
from edge_runtime.families.decision2.prompt import PromptRow, render
from edge_runtime.packages.golden import npz_bytes

KIND = "decision2"
CONFIG_FORMAT = "decision2-package/1"
#: |onnx+numpy - torch| allowed on a candidate logit (the fixtures measure 3-4e-7)
LOGIT_TOLERANCE = 1e-5
#: merged LoRA vs the unmerged forward, on last_hidden_state
MERGE_TOLERANCE = 1e-4
GOLDEN_STATE = "Write a Python function that merges two sorted lists and explain its running time."
GOLDEN_QUESTIONS: list[tuple[str, str, list[tuple[str, Any]]]] = [
    ("choice", "Which domain does this request belong to?",
     [("code", "Programming"), ("math", "Mathematics"), ("other", "Anything else")]),
    ("noul", "Does answering this request need multi-step reasoning?", [("false", None), ("true", None)]),
    ("score", "How difficult is this request?", [("0", "Trivial"), ("1", "Moderate"), ("2", "Hard")]),
]


@dataclass
class Decision2Options(PackageIdentity):
    base: Path | None = None
    check_questions: int = 24
    seed: int = 0


# ---- backbone -------------------------------------------------------------------------------


def _strip(name: str) -> str | None:
    """A base/backbone tensor name as Qwen3Model names it; None for tensors it does not hold."""
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    if name.startswith(("lm_head.", "visual.")):
        return None
    return name


def _load_weights(files: Sequence[Path]) -> dict[str, Any]:
    from safetensors.torch import load_file

    out = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            name = _strip(k)
            if name is not None and not name.startswith("visual."):
                out[name] = v.float()
    return out


def build_model(cfg: dict[str, Any], weights: dict[str, Any]) -> Any:
    """HF ``Qwen3Model`` (SDPA, fp32, eval) with the backbone's tensors (tied embeddings: nothing else
    may be missing)."""
    from transformers import Qwen3Config, Qwen3Model

    from converters.torch_models import load_backbone

    return load_backbone(Qwen3Model, Qwen3Config, cfg, weights, "the backbone")


def lora_factors(source: Decision2Source) -> tuple[dict[str, tuple[Any, Any]], float]:
    """{target module: (A [r, in], B [out, r])} and the scaling alpha / r, checked against the contract."""
    from safetensors.torch import load_file

    contract = source.config.get("lora") or {}
    acfg = json.loads((source.root / "adapter" / "adapter_config.json").read_text(encoding="utf-8"))
    targets = contract.get("target_modules") or []
    if acfg.get("peft_type") != "LORA" or acfg.get("bias") != "none" or acfg.get("r") != contract.get("rank") \
            or acfg.get("lora_alpha") != contract.get("alpha"):
        raise ConversionError("adapter_config.json differs from the decision_config.json LoRA contract")
    tensors = load_file(str(source.root / "adapter" / "adapter_model.safetensors"))
    factors = {}
    dims = contract.get("target_dimensions") or {}
    for t in targets:
        a, b = tensors.get(f"base_model.model.{t}.lora_A.weight"), tensors.get(f"base_model.model.{t}.lora_B.weight")
        if a is None or b is None or a.dtype.__str__() != "torch.float32" or b.dtype.__str__() != "torch.float32":
            raise ConversionError(f"adapter: {t} needs F32 lora_A and lora_B")
        inn, out = dims.get(t, [None, None])
        if list(a.shape) != [contract["rank"], inn] or list(b.shape) != [out, contract["rank"]]:
            raise ConversionError(f"adapter: {t} factors have shapes {list(a.shape)}, {list(b.shape)}")
        factors[t] = (a, b)
    if len(tensors) != 2 * len(factors):
        raise ConversionError("adapter: tensors beyond the contract's target modules")
    return factors, float(contract["alpha"]) / float(contract["rank"])


def merge_lora(model: Any, factors: dict[str, tuple[Any, Any]], scaling: float) -> None:
    import torch

    modules = dict(model.named_modules())
    with torch.no_grad():
        for target, (a, b) in factors.items():
            if target not in modules:
                raise ConversionError(f"adapter target {target} is not a module of the backbone")
            modules[target].weight += scaling * (b @ a)


def unmerged_hidden(model: Any, factors: dict[str, tuple[Any, Any]], scaling: float, ids: Sequence[int]) -> Any:
    """last_hidden_state with LoRA applied as base(x) + B(A(x)) * scaling (hooks, no merge)."""
    import torch

    modules = dict(model.named_modules())
    hooks = []
    for target, (a, b) in factors.items():
        def hook(mod: Any, inputs: Any, output: Any, a: Any = a, b: Any = b) -> Any:
            return output + (inputs[0] @ a.T @ b.T) * scaling
        hooks.append(modules[target].register_forward_hook(hook))
    try:
        with torch.no_grad():
            return model(input_ids=torch.tensor([list(ids)])).last_hidden_state[0]
    finally:
        for h in hooks:
            h.remove()


# ---- reference and parity ----------------------------------------------------------------------


def torch_head_logits(head: dict[str, np.ndarray], hidden: Any, row: PromptRow) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in head.items()}
    h = hidden.shape[-1]
    c = F.layer_norm(hidden[row.endpoints], (h,), t["candidate_norm.weight"], t["candidate_norm.bias"], eps=1e-5)
    q = F.layer_norm(hidden[row.query], (h,), t["query_norm.weight"], t["query_norm.bias"], eps=1e-5)
    d = t["key.weight"].shape[0]
    bil = (c @ t["key.weight"].T * (t["query.weight"] @ q)).sum(-1) / math.sqrt(d)
    mlp = F.gelu(c @ t["candidate_mlp.weight"].T + t["candidate_mlp.bias"] + t["query_mlp.weight"] @ q)
    return (bil + mlp @ t["scalar.weight"][0]).numpy()


def check_questions(n: int, seed: int) -> list[tuple[Any, str, Any, list[tuple[str, Any]]]]:
    """(state, kind, instructions, options): the golden three, then ``n`` generated ones."""
    rng = random.Random(seed)
    states = [GOLDEN_STATE, {"user": "Où est ma commande ?", "order": {"id": 1182}}, ["a", 1, None],
              "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 20]
    out: list[tuple[Any, str, Any, list[tuple[str, Any]]]] = [(GOLDEN_STATE, k, i, o) for k, i, o in GOLDEN_QUESTIONS]
    for i in range(n):
        kind = ("choice", "noul", "score")[i % 3]
        state = rng.choice(states)
        if kind == "choice":
            opts = [(f"opt{j}", rng.choice([None, "Programming", {"x": [1, 2]}, "Anything else"]))
                    for j in range(rng.randint(2, 6))]
        elif kind == "noul":
            opts = [("false", rng.choice([None, "no"])), ("true", rng.choice([None, "yes, clearly"]))]
        else:
            opts = [(str(j), f"level {j}") for j in range(rng.choice([2, 3, 5, 7]))]
        out.append((state, kind, rng.choice(["Which fits?", {"task": "route"}, "How hard?"]), opts))
    return out


def _feeds(rows: Sequence[PromptRow], names: Sequence[str], pad: int) -> dict[str, np.ndarray]:
    """The server's right-padded feeds, limited to the graph's inputs ``names``."""
    feeds = pad_rows(list(rows), pad)
    return {n: feeds[n] for n in names}


@dataclass
class Decision2Parity:
    logits: float
    merge: float | None
    questions: int


def verify_parity(model: Any, session: Any, tok: Any, head_arrays: dict[str, np.ndarray], source: Decision2Source,
                  pad: int, n: int, seed: int) -> Decision2Parity:
    """The package's path (the server's Decision2Assets: rows, padding, head, §1.8 answers) against
    PyTorch (the source backbone and the head in torch), on the golden and ``n`` generated questions."""
    import torch

    limit = int(source.manifest["max_input_tokens"])
    assets = Decision2Assets(tok, CandidateHead.from_arrays(head_arrays), limit, pad, source.temperatures,
                             source.score_bias)
    qs = check_questions(n, seed)
    rows = [assets.render(s, k, i, o) for s, k, i, o in qs]
    names = [i.name for i in session.get_inputs()]
    hidden = session.run(["last_hidden_state"], _feeds(rows, names, pad))[0]
    worst = 0.0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices on shared CPUs: one thread is much faster
    try:
        for r, row, (_, kind, _, opts) in zip(range(len(rows)), rows, qs):
            got = assets.logits(row, hidden[r])
            with torch.no_grad():
                ref_h = model(input_ids=torch.tensor([row.ids])).last_hidden_state[0]
            want = torch_head_logits(head_arrays, ref_h, row)
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
            a, b = assets.answer(kind, opts, got), assets.answer(kind, opts, want)
            if "error" in a or "error" in b:
                raise ConversionError(f"parity: question {r} has no answer: {a} vs {b}")
            if a.get("choice") != b.get("choice") or any(
                    abs(a["probabilities"][k] - b["probabilities"][k]) > 1e-4 for k in a.get("probabilities", {})):
                raise ConversionError(f"parity: question {r} answers differ: {a} vs {b}")
    finally:
        torch.set_num_threads(threads)
    if not worst <= LOGIT_TOLERANCE:
        raise ConversionError(f"parity check failed: max |package - torch| candidate logit {worst:.3g} exceeds "
                              f"{LOGIT_TOLERANCE:g}; no package written")
    return Decision2Parity(worst, None, len(qs))


# ---- export --------------------------------------------------------------------------------------


def export_decision2(src: str | Path, out: Path, opts: Decision2Options) -> ExportResult:
    """Convert the Decision 2.0 package at ``src`` into an edge-runtime package at ``out``."""
    from converters.package_writer import check_replaceable

    try:
        check_replaceable(Path(out))
    except ValueError as e:
        raise ConversionError(str(e)) from None
    timings: dict[str, float] = {}
    with Step(f"reading and verifying {src}") as s:
        source = read_decision2(Path(src), opts.base)
    timings["read"] = s.seconds
    with Step("loading PyTorch, transformers and Optimum") as s:
        import torch
        import transformers
        from safetensors.numpy import load_file as load_np
        from tokenizers import Tokenizer

        from converters import verify
        from converters.decision_codes import export_graph
    timings["imports"] = s.seconds
    merge_diff = None
    with Step(f"loading the {source.profile} backbone") as s:
        if source.profile == "qwen-full":
            weights = _load_weights(sorted((source.root / "backbone").glob("*.safetensors")))
            model = build_model(source.backbone_config, weights)
        else:
            assert source.base is not None
            weights = _load_weights(sorted(source.base.glob("*.safetensors")))
            model = build_model(source.backbone_config, weights)
            factors, scaling = lora_factors(source)
            tok0 = Tokenizer.from_file(str(source.root / "tokenizer.json"))
            probe = render(tok0, GOLDEN_STATE, "choice", GOLDEN_QUESTIONS[0][1], GOLDEN_QUESTIONS[0][2],
                           int(source.manifest["max_input_tokens"])).ids
            unmerged = unmerged_hidden(model, factors, scaling, probe)
            merge_lora(model, factors, scaling)
            with torch.no_grad():
                merged = model(input_ids=torch.tensor([probe])).last_hidden_state[0]
            merge_diff = float((merged - unmerged).abs().max())
            base_only = build_model(source.backbone_config, weights)
            with torch.no_grad():
                moved = float((base_only(input_ids=torch.tensor([probe])).last_hidden_state[0] - merged).abs().max())
            if not merge_diff <= MERGE_TOLERANCE or moved <= 10 * MERGE_TOLERANCE:
                raise ConversionError(f"LoRA merge check failed: merged vs unmerged {merge_diff:.3g}, "
                                      f"vs the base alone {moved:.3g}")
            log(f"LoRA merged: merged vs unmerged forward {merge_diff:.3g} (the adapter moves states by {moved:.3g})")
        head_arrays = load_np(str(source.root / "decision_head.safetensors"))
        tok = Tokenizer.from_file(str(source.root / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        tcfg = json.loads((source.root / "tokenizer_config.json").read_text(encoding="utf-8"))
        pad_token = tcfg.get("pad_token") or tcfg.get("eos_token")
        pad = tok.token_to_id(pad_token) if isinstance(pad_token, str) else None
        if pad is None:
            raise ConversionError("tokenizer_config.json names no pad_token or eos_token the tokenizer knows")
    timings["load"] = s.seconds
    name = sanitize_name(opts.name or source.pointer.get("model_name") or Path(src).name)
    with tempfile.TemporaryDirectory(prefix="er-decision2-") as tmp:
        with Step("exporting Qwen3Model to ONNX") as s:
            graph = export_graph(model, "causal", Path(tmp) / "onnx")
        timings["export"] = s.seconds
        session = verify.create_session(graph)
        with Step("checking candidate logits against PyTorch") as s:
            parity = verify_parity(model, session, tok, head_arrays, source, pad, opts.check_questions, opts.seed)
        timings["parity"] = s.seconds
        log(f"parity: max |package - torch| candidate logit {parity.logits:.3g} over {parity.questions} questions")
        import onnx

        g = onnx.load(str(graph), load_external_data=False)
        inputs, outputs = [i.name for i in g.graph.input], [o.name for o in g.graph.output]
        golden_row = render(tok, GOLDEN_STATE, "choice", GOLDEN_QUESTIONS[0][1], GOLDEN_QUESTIONS[0][2],
                            int(source.manifest["max_input_tokens"]))
        feeds = _feeds([golden_row], inputs, pad)
        goldens = {"fp32": [(feeds, {"last_hidden_state": session.run(["last_hidden_state"], feeds)[0]})]}
        config = {
            "format": CONFIG_FORMAT, "prompt_version": PROMPT_VERSION, "pad_token_id": int(pad),
            "max_input_tokens": int(source.manifest["max_input_tokens"]), "head_dim": int(source.config["head_dim"]),
            "temperature_by_type": source.temperatures,
            "score_bias": {str(k): v for k, v in (source.score_bias or {}).items()} or None,
            "source": {"identity": source.identity, "profile": source.profile,
                       "model_name": source.pointer.get("model_name"),
                       "lora_merged": source.profile == "qwen-adapter"},
        }
        files: dict[str, Path | bytes] = {
            "model.onnx": graph, "tokenizer.json": tok.to_str().encode("utf-8"),
            "head.npz": npz_bytes({k: np.asarray(v, dtype=np.float32) for k, v in head_arrays.items()}),
            "decision_config.json": (json.dumps(config, sort_keys=True, indent=2) + "\n").encode("utf-8"),
        }
        outputs_diff = {"candidate_logits": float(f"{parity.logits:.3g}")}
        if merge_diff is not None:
            outputs_diff["lora_merge_hidden"] = float(f"{merge_diff:.3g}")
        card = {
            **card_start(name, KIND, KIND, identity_card(
                opts, Path(src), source_name=opts.source_name or source.pointer.get("model_name") or Path(src).name,
                architecture=source.config["architecture"], stamp=source.identity,
                description=f"Decision 2.0 ({source.profile}) converted from {Path(src).name}")),
            "head": {"output": "last_hidden_state", "readout": "candidate", "weights": "head.npz",
                     "head_dim": int(source.config["head_dim"])},
            "limits": {"max_input_tokens": int(source.manifest["max_input_tokens"])},
            "graph": {"inputs": inputs, "outputs": outputs, "opset": 18},
            "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
            "verification": {"reference": f"PyTorch {torch.__version__.split('+')[0]} / transformers "
                                          f"{transformers.__version__} Qwen3Model + candidate head in torch",
                             "max_abs_diff": outputs_diff["candidate_logits"], "tolerance": LOGIT_TOLERANCE,
                             "cases": parity.questions, "outputs": outputs_diff},
            "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source.identity,
                      "options": {"kind": KIND, "check_questions": opts.check_questions}},
            "question_types": ["choice", "noul", "score"],
        }
        with Step(f"writing package {out}") as s:
            from converters.package_writer import write_package

            digest = write_package(Path(out), card, files, goldens)
        timings["write"] = s.seconds
    from edge_runtime.families.registry import read_package

    return ExportResult(path=Path(out), digest=digest, card=read_package(Path(out)).card.raw, timings=timings)


# ---- fixture (upstream format) ------------------------------------------------------------------


def _qwen3_config(vocab: int) -> dict[str, Any]:
    return {"architectures": ["Qwen3Model"], "model_type": "qwen3", "attention_bias": False, "head_dim": 16,
            "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
            "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 4096,
            "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "rope_scaling": None, "tie_word_embeddings": True, "vocab_size": vocab}


def write_decision2_fixture(out: Path, seed: int = 0, adapter: bool = False, max_input_tokens: int = 2048) -> Path:
    """A tiny qwen3 Decision 2.0 package (qwen-full with score bias, or qwen-adapter over ``<out>-base``)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3Model

    from converters.fixture_tokenizers import byte_level_bpe
    from converters.vela2_source import FIXTURE_CORPUS

    root = Path(out)
    root.mkdir(parents=True, exist_ok=False)
    tok = byte_level_bpe(FIXTURE_CORPUS[:7] * 4, ["<|endoftext|>"], vocab_size=384)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": 4096}, indent=2) + "\n")
    cfg = _qwen3_config(tok.get_vocab_size())
    model = Qwen3Model(Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}))
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, p in model.named_parameters():
        v = torch.randn(p.shape, generator=gen) * 0.05
        if name.endswith("norm.weight"):
            v = v + 1.0
        weights[name] = v.to(torch.bfloat16) if name in linear else v
    dcfg: dict[str, Any] = {
        "architecture": "qwen3-text-endpoints-global-query-shared-bilinear-mlp", "head_variant": "shared",
        "backbone_model_type": "qwen3", "prompt_version": PROMPT_VERSION, "head_dim": 32, "max_options": 255,
        "parameter_dtype": "float32", "autocast_dtype": "bfloat16", "head_compute_dtype": "float32",
        "attention": "sdpa"}
    base_root = None
    if adapter:
        base_root = root.parent / f"{root.name}-base"
        base_root.mkdir(parents=True, exist_ok=False)
        (base_root / "config.json").write_text(json.dumps(
            {"model_type": "qwen3_vl_wrapper", "architectures": ["Wrapper"], "text_config": cfg}, indent=2) + "\n")
        base = {f"model.language_model.{k}": v for k, v in weights.items()}
        base["model.visual.patch_embed.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        save_file(base, str(base_root / "model-00001-of-00001.safetensors"))
        targets = [f"layers.{i}.mlp.{p}" for i in range(cfg["num_hidden_layers"])
                   for p in ("gate_proj", "up_proj", "down_proj")]
        gen_lora = torch.Generator().manual_seed(seed + 1)
        lora, dims = {}, {}
        for t in targets:
            out_f, in_f = weights[f"{t}.weight"].shape
            dims[t] = [in_f, out_f]
            lora[f"base_model.model.{t}.lora_A.weight"] = torch.randn((4, in_f), generator=gen_lora) * 0.05
            lora[f"base_model.model.{t}.lora_B.weight"] = torch.randn((out_f, 4), generator=gen_lora) * 0.05
        (root / "adapter").mkdir()
        save_file(lora, str(root / "adapter" / "adapter_model.safetensors"))
        (root / "adapter" / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "bias": "none",
             "target_modules": ["down_proj", "gate_proj", "up_proj"]}, indent=2) + "\n")
        dcfg.update(checkpoint_format=LORA_FORMAT, lora={
            "rank": 4, "alpha": 8, "dropout": 0.05, "target_modules": targets, "target_dimensions": dims,
            "source_kind": "posttrained", "base_revision": "0" * 39 + "1",
            "source_fingerprint": {"source_name": base_root.name, "files_sha256": source_files(base_root)}})
    else:
        dcfg["checkpoint_format"] = "full"
        (root / "backbone").mkdir()
        (root / "backbone" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(weights, str(root / "backbone" / "model.safetensors"))
    gen_head = torch.Generator().manual_seed(seed + 2)
    h, d = cfg["hidden_size"], 32
    shapes = {"candidate_norm.weight": (h,), "candidate_norm.bias": (h,), "query_norm.weight": (h,),
              "query_norm.bias": (h,), "key.weight": (d, h), "query.weight": (d, h), "candidate_mlp.weight": (d, h),
              "candidate_mlp.bias": (d,), "query_mlp.weight": (d, h), "scalar.weight": (1, d)}
    save_file({k: torch.randn(s, generator=gen_head) * 0.2 for k, s in shapes.items()},
              str(root / "decision_head.safetensors"))
    (root / "decision_config.json").write_text(json.dumps(dcfg, indent=2) + "\n")
    hashes = checkpoint_files(root)
    if adapter:
        assert base_root is not None
        hashes = {**{f"checkpoint/{k}": v for k, v in hashes.items()},
                  **{f"source/{k}": v for k, v in source_files(base_root).items()}}
    identity = sha256_json(hashes)
    bias_entry = None
    if not adapter:
        offsets = {"3": [0.05, -0.02, 0.01], "5": [0.04, 0.2, 0.08, -0.15, -0.17]}
        (root / "score_bias.json").write_text(json.dumps({"format": "dev2-score-bias-v1", "model_sha256": identity,
                                                          "offsets": offsets, "fit": {"source": "fixture"}}, indent=2))
        bias_entry = {"file": "score_bias.json", "offsets": offsets, "sha256": sha256_file(root / "score_bias.json")}
    (root / "decision2").mkdir()
    (root / "decision2" / "__init__.py").write_text('raise RuntimeError("package code must never be imported")\n')
    model_name = "Decision-2.0-Tiny-Qwen3" + ("-LoRA" if adapter else "")
    groups = {"head": ["decision_head.safetensors"], "residual": []}
    groups["adapter" if adapter else "backbone"] = ["adapter/adapter_model.safetensors" if adapter
                                                    else "backbone/model.safetensors"]
    packaged = {g: sum(safetensors_elements(root / n) for n in names) for g, names in groups.items()}
    (root / "config.json").write_text(json.dumps({**POINTER, "model_name": model_name,
                                                  "runtime_family": "decision2-qwen-adapter" if adapter
                                                  else "decision2-qwen-full", "manifest": MANIFEST,
                                                  "max_input_tokens": max_input_tokens}, indent=2) + "\n")
    files = {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}
    manifest: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA, "kind": "fixture", "model_name": model_name,
        "profile": "qwen-adapter" if adapter else "qwen-full", "files_sha256": files,
        "identity": {"model_sha256": identity}, "max_input_tokens": max_input_tokens,
        "licence": {"spdx": "apache-2.0", "components": []}, "calibration": None,
        "parameters": {"packaged": packaged, "packaged_files": groups,
                       "loaded": packaged["head"] + sum(v.numel() for v in weights.values())},
    }
    if bias_entry:
        manifest["score_bias"] = bias_entry
    if adapter:
        assert base_root is not None
        manifest["base"] = {"repo_id": "edge-runtime-fixtures/tiny-base", "revision": "0" * 39 + "1",
                            "files_sha256": {p.name: sha256_file(p) for p in sorted(base_root.iterdir())
                                             if p.is_file()}}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return root
