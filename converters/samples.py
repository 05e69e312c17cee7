"""Fixed, varied text used to verify exports, measure int8 agreement and train fixture tokenizers.

Mixed on purpose: plain English, other Latin-script languages, CJK, emoji, code, numbers, URLs,
and a few long passages, so that the samples cover many token lengths and vocabulary corners.
"""

from __future__ import annotations

SAMPLE_TEXTS: tuple[str, ...] = (
    "Hello world.",
    "How do I reset my password?",
    "My card was charged twice and the parcel never arrived.",
    "The quick brown fox jumps over the lazy dog.",
    "Please cancel my subscription before the next billing cycle.",
    "Is there a vegetarian option on the lunch menu today?",
    "The meeting has been moved to Thursday at 3 pm in room 4B.",
    "Our servers in Frankfurt were unreachable for twelve minutes last night.",
    "I love this phone, but the battery dies by noon.",
    "Can you recommend a good book about the history of mathematics?",
    "The contract ends on 31 December 2025 unless either party renews it.",
    "Water boils at 100 degrees Celsius at sea level.",
    "She sold 1,250 units in Q3, up 18% from the previous quarter.",
    "Where is the nearest train station?",
    "The patient reported mild headaches and occasional dizziness.",
    "Turn left at the second traffic light, then keep going for 500 m.",
    "Thanks a lot, that fixed it!",
    "Absolutely terrible service; I waited two hours and nobody called back.",
    "Send the invoice to billing@example.com before Friday.",
    "Visit https://example.org/docs/getting-started for the installation guide.",
    "Le train de 8 h 15 pour Lyon est annulé en raison d'une grève.",
    "Können Sie mir bitte die Rechnung per E-Mail schicken?",
    "¿Dónde puedo encontrar la política de devoluciones?",
    "Il pleut depuis trois jours et la rivière déborde.",
    "Ação rápida evitou que o incêndio se espalhasse pela floresta.",
    "Dziękuję bardzo za pomoc przy przeprowadzce.",
    "今日は天気がいいので、公園を散歩しました。",
    "我的订单还没有发货，请帮我查一下。",
    "这个模型可以在边缘设备上运行吗？",
    "서울의 지하철은 깨끗하고 편리합니다.",
    "東京タワーの高さは333メートルです。",
    "Привет! Как у тебя дела?",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "مرحبا، كيف يمكنني مساعدتك اليوم؟",
    "Great job team 🎉🎉 the release shipped on time 🚀",
    "I'm so tired 😴 but the coffee ☕ helps.",
    "Weather today: ☀️ 24°C, tomorrow 🌧️ 17°C.",
    "❤️ thanks for the flowers 💐",
    "def add(a, b):\n    return a + b",
    "for (let i = 0; i < items.length; i++) { total += items[i].price; }",
    "SELECT name, email FROM users WHERE created_at > '2024-01-01' ORDER BY name;",
    "git commit -m \"fix: handle empty input\" && git push origin main",
    "if err != nil { return fmt.Errorf(\"open %s: %w\", path, err) }",
    "import numpy as np\nx = np.linspace(0, 1, 11)\nprint(x.mean())",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "{\"id\": 42, \"tags\": [\"alpha\", \"beta\"], \"active\": true}",
    "Error 503: service unavailable (retry after 5 s)",
    "pip install onnxruntime==1.32.0 tokenizers numpy",
    "The mitochondria is the powerhouse of the cell.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "A stitch in time saves nine.",
    "The committee will publish its final report after reviewing all 312 submissions, "
    "including the late ones that arrived by post during the strike.",
    "After the storm passed, the villagers gathered in the square to count the damage, share "
    "what food they had left, and decide who would walk to the next town to ask for help.",
    "Quantum computers exploit superposition and entanglement to explore many states at once, "
    "but keeping qubits coherent long enough to finish a useful computation remains hard.",
    "The library opens at nine on weekdays and at ten on Saturdays; it is closed on Sundays "
    "and public holidays, and the reading room requires a card that you can get at the desk.",
    "In 1969 Apollo 11 landed on the Moon; Neil Armstrong and Buzz Aldrin spent about two and "
    "a half hours outside the lunar module while Michael Collins orbited above.",
    "Return policy: items may be returned within 30 days in their original packaging with the "
    "receipt. Sale items, gift cards and opened software cannot be returned or exchanged. "
    "Refunds are issued to the original payment method within 5-7 business days.",
    "To configure the service, copy the example file to config.yaml, set the listen address to "
    "127.0.0.1, choose the number of worker threads, and list every model with its package path "
    "and variant; then start the server and check that /health reports ready.",
    "John Smith works at Acme Corporation in New York.",
    "Marie Curie won Nobel prizes in physics and chemistry.",
)

#: (query, document) pairs for cross-encoders, some relevant and some not.
SAMPLE_PAIRS: tuple[tuple[str, str], ...] = (
    ("How do I reset my password?", "Open Settings, choose Account, then Reset password and follow the e-mail link."),
    ("How do I reset my password?", "Our office is closed on public holidays."),
    ("What is the capital of Greece?", "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας."),
    ("What is the capital of Greece?", "The quick brown fox jumps over the lazy dog."),
    ("refund for a double charge", "My card was charged twice and the parcel never arrived."),
    ("python add two numbers", "def add(a, b):\n    return a + b"),
    ("python add two numbers", "SELECT name FROM users;"),
    ("train to Lyon", "Le train de 8 h 15 pour Lyon est annulé en raison d'une grève."),
    ("公园散步", "今日は天気がいいので、公園を散歩しました。"),
    ("moon landing", "In 1969 Apollo 11 landed on the Moon; Neil Armstrong and Buzz Aldrin spent about two and "
                     "a half hours outside the lunar module while Michael Collins orbited above."),
    ("return an opened game", "Return policy: items may be returned within 30 days in their original packaging "
                              "with the receipt. Sale items, gift cards and opened software cannot be returned."),
    ("weather 🌧️", "Weather today: ☀️ 24°C, tomorrow 🌧️ 17°C."),
)


#: The upstream-format fixtures' tokenizer text (Decision 2.0's prompt words, then Vela 2.0's strings).
DECISION_FIXTURE_CORPUS = [
    "Context:\nTask type: choice\nQuestion:\nOptions:\n<option>\n</option>\n\nSelect the single option best supported "
    "by the context and instructions.\nDecision:",
    '{"description":"Yes","key":"true"} {"description":"No","key":"false"} {"key":"0"} {"key":"1"} {"key":"2"}',
    "Write a Python function that merges two sorted lists and explain its running time.",
    "Which domain does this request belong to? Programming Mathematics Anything else",
    "Does answering this request need multi-step reasoning? How difficult is this request? Trivial Moderate Hard",
    "Route the request to the model that answers it best. code math chat creative writing translation summary",
    "The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`",
    "Hi, I'm Tom Baker (tom.baker@example.com). What is the maximum daily dose of paracetamol for an adult?",
    "For adults, the maximum dose of paracetamol is 4 grams in 24 hours. Visit https://example.org/dose today.",
    "Which spans are personal information? a person's name an e-mail address a claim not supported by the context",
    'Task type: span Target: user Question: Labels: <label> </label> Text: Spans: <segment role="user"> </segment>',
]


def fixture_corpus() -> list[str]:
    """A few hundred varied sentences to train a fixture's WordPiece vocabulary (deterministic)."""
    subjects = ("the server", "my order", "this model", "the invoice", "our team", "the train", "your phone",
                "la facture", "der Zug", "el pedido", "注文", "模型", "서버")
    verbs = ("failed", "arrived late", "works fine", "was cancelled", "needs an update", "is ready", "crashed 💥",
             "was delivered 📦", "is slow 🐢", "passed the tests ✅")
    times = ("today", "yesterday", "at 09:30", "on Monday", "after 3 retries", "in 2024", "tonight")
    corpus = list(SAMPLE_TEXTS)
    corpus += [f"{q} {d}" for q, d in SAMPLE_PAIRS]
    i = 0
    for s in subjects:
        for v in verbs:
            corpus.append(f"{s} {v} {times[i % len(times)]}.")
            i += 1
    corpus += [f"x_{n} = compute(y[{n}], z={n * 7 % 13}) # step {n}" for n in range(20)]
    return corpus
