from tests.conftest_fixtures import *  # noqa: F401,F403  (fixture packages, built once per session)
from tests.conftest_server import *  # noqa: F401,F403  (session servers over those packages)
