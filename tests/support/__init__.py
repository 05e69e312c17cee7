"""What the tests share: server harnesses, fixture packages and session servers (loaded as pytest
plugins by tests/conftest.py), media and tokenizer samples, the contract's examples. No test module
imports another; they import from here."""
