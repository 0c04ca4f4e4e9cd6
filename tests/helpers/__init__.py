"""Code shared by several test modules, by concern (fixtures live in tests/conftest.py, tiny models and
drafter checkpoints in tests/tiny.py); no test module imports another."""
