"""Converters: turn Hugging Face models into edge-runtime packages (``python -m converters``).

This package may import torch, transformers and optimum; the server never imports it.
"""

#: 0.2.0: the "int8" variant is per-token (exact); the dynamic one is "int8-dynamic".
#: 0.3.0: exact int8 weights are +-64 (no 16-bit pair sum can saturate on AVX2), encoders' activations
#: are smoothed, and embedders' agreement is measured on real sentences (issue 29).
#: 0.4.0: encoders' exact int8 multiplies each activation's 4 largest channels in fp32, and a quantized
#: variant records the CPU its agreement was measured on.
#: 0.5.0: task-heads packages (ModernBERT task sources) carry the exact int8 by default, with its agreement
#: read through the head and its integer products proven at conversion.
#: 0.6.0: encoders' attention shape arithmetic is folded into constants in the fp32 and exact int8 graphs,
#: bit-identical to the unfolded graphs (checked at every build; issue 40); vela2 packages carry the exact
#: int8 by default, with its answers' agreement and its integer products proven at conversion (issue 37).
#: 0.7.0: every pick of a static dimension out of a Shape is a constant (converters.static_dims), and the
#: task-heads and vela2 graphs (ModernBERT) are folded too, bit-identical to the export (issue 37: a 307M
#: int8 forward runs 1,895 kernels instead of 2,431); the exact int8's outlier channels add to the integer
#: product inside one Gemm instead of a MatMul and an Add (the same bits).
#: 0.8.0: SDPA's scale of K moves before K's transpose (the same bits), so ONNX Runtime folds that transpose
#: into the attention's MatMul (issue 37: one copy of K less a layer); the folded BERT attention's scores
#: read K transposed (FusedMatMul transB) instead of a copy of K^T (the same bits); task-heads graphs run
#: their rotary embedding as ONNX Runtime's RotaryEmbedding kernel (converters.rotary: not bit-identical,
#: within 1e-4 of the export's hidden states, parity and int8 agreement measured on the fused graph).
#: 0.9.0: the exact int8 takes each token's max|x| as max(max x, -min x) instead of the max of an |x| tensor
#: written and read back; a matmul read only in pieces (ModernBERT's Q/K/V unbind, GeGLU's halves) is one
#: integer matmul per piece (converters.matmul_pieces); activations with outlier channels are quantized as
#: rows, so their products need no reshapes to rows and back (all the same bits; issue 37).
#: 0.10.0: the calibrated exact int8 graph has a second body for forwards of up to 64 tokens (converters.
#: small_forward: max|x| from |x|, the token scale inside the integer GEMM, Q, K and V as one GEMM), chosen
#: by an If on the token count; the same bits as the other body, proven at conversion (issue 40).
CONVERTER_VERSION = "0.10.0"
