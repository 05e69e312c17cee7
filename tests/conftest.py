from tests.conftest_fixtures import *  # noqa
