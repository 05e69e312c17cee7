# Fixture packages (built once per session) and session servers over them.
pytest_plugins = ["tests.support.fixtures", "tests.support.servers"]
