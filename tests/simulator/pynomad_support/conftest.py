"""Fixtures python-nomad's tests expect: clients for the simulator under test."""

import nomad
import pytest
import tests.common as common  # type: ignore[import-not-found]  # resolved in the run folder


@pytest.fixture
def nomad_setup() -> nomad.Nomad:
    # The token is read when each test starts, after test_acl.py has bootstrapped it.
    return nomad.Nomad(
        host=common.IP, port=common.NOMAD_PORT, verify=False, token=common.NOMAD_TOKEN
    )


@pytest.fixture
def nomad_setup_with_namespace() -> nomad.Nomad:
    return nomad.Nomad(
        host=common.IP,
        port=common.NOMAD_PORT,
        verify=False,
        token=common.NOMAD_TOKEN,
        namespace=common.NOMAD_NAMESPACE,
    )
