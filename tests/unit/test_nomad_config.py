import ssl

import pytest

from controller.nomad.config import REDACTED, ConfigError, NomadConfig, scrub

TOKEN = "s3cr3t-token-0123456789"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"address": "http://127.0.0.1:4646", "token": None, "namespace": "default"}),
        # Unset and empty are the same, as in the Nomad CLI.
        ({"NOMAD_ADDR": "", "NOMAD_TOKEN": ""}, {"address": "http://127.0.0.1:4646"}),
        ({"NOMAD_ADDR": "https://nomad.example:4646"}, {"address": "https://nomad.example:4646"}),
        ({"NOMAD_ADDR": "http://10.0.0.1:4646/"}, {"address": "http://10.0.0.1:4646"}),
        ({"NOMAD_ADDR": "https://nomad.example"}, {"address": "https://nomad.example:443"}),
        ({"NOMAD_ADDR": "http://nomad.example"}, {"address": "http://nomad.example:80"}),
        ({"NOMAD_ADDR": "http://[::1]:4646"}, {"address": "http://[::1]:4646", "host": "::1"}),
        (
            {"NOMAD_TOKEN": TOKEN, "NOMAD_NAMESPACE": "runners", "NOMAD_REGION": "eu"},
            {"token": TOKEN, "namespace": "runners", "region": "eu"},
        ),
        ({}, {"skip_verify": False}),
    ]
    + [({"NOMAD_SKIP_VERIFY": v}, {"skip_verify": True}) for v in
       ("1", "t", "T", "TRUE", "true", "True")]
    + [({"NOMAD_SKIP_VERIFY": v}, {"skip_verify": False}) for v in
       ("0", "f", "F", "FALSE", "false", "False", "")],
)  # fmt: skip
def test_from_env(env, expected):
    config = NomadConfig.from_env(env)
    for attribute, value in expected.items():
        assert getattr(config, attribute) == value, attribute


# What each variable refuses.
BAD_VALUES = {
    "NOMAD_SKIP_VERIFY": ["yes", "tRuE", " true"],
    "NOMAD_ADDR": [
        "127.0.0.1:4646",
        "ftp://nomad:21",
        "unix:///var/run/nomad.sock",
        "http://",
        "http://nomad:notaport",
        "http://nomad:99999",
        "http://nomad:4646/ui",
    ],
    "NOMAD_CACERT": ["/nonexistent/ca.pem"],
    "NOMAD_CLIENT_CERT": ["/nonexistent/c.pem"],
}


@pytest.mark.parametrize(
    ("named", "value"), [(name, value) for name, values in BAD_VALUES.items() for value in values]
)
def test_bad_values_name_the_variable_and_value(named, value):
    with pytest.raises(ConfigError) as info:
        NomadConfig.from_env({named: value, "NOMAD_TOKEN": TOKEN})
    message = str(info.value)
    assert named in message
    assert value in message
    assert TOKEN not in message


# Addresses with credentials, each refused on another of the parser's paths; the
# password is "hunter2" in each.
WITH_CREDENTIALS = [
    "https://user:hunter2@nomad:4646",
    "https://:hunter2@nomad:4646",
    "https://hunter2@nomad:4646",
    "https://user:hun@ter2@nomad:4646",  # an `@` in the password, not percent-encoded
    "https://user:hunter2@nomad:notaport",
    "https://user:hunter2@nomad:99999",
    "ftp://user:hunter2@nomad:21",
    "https://user:hunter2@",
    "https://user:hunter2@nomad:4646/ui?x=1",
    "https://user:hunter2@[::1",
]


@pytest.mark.parametrize("value", WITH_CREDENTIALS)
def test_an_address_with_credentials_is_refused_without_echoing_them(value):
    with pytest.raises(ConfigError) as info:
        NomadConfig.from_env({"NOMAD_ADDR": value, "NOMAD_TOKEN": TOKEN})
    message = str(info.value)
    assert message.startswith("NOMAD_ADDR: invalid address")
    assert f"{REDACTED}@" in message
    for secret in ("hunter2", "hun", "ter2", TOKEN):
        assert secret not in message, message


def test_scrub_masks_the_token_and_every_url_credential():
    text = (
        f"GET http://a:b@nomad:4646/v1/jobs: 500 upstream https://admin:pw@10.0.0.1 "
        f"refused 'http://u@x' with {TOKEN}; user@example.org wrote it"
    )
    assert scrub(text, TOKEN) == (
        f"GET http://{REDACTED}@nomad:4646/v1/jobs: 500 upstream https://{REDACTED}@10.0.0.1 "
        f"refused 'http://{REDACTED}@x' with {REDACTED}; user@example.org wrote it"
    )
    assert scrub("http://nomad:4646/v1/jobs?x=1") == "http://nomad:4646/v1/jobs?x=1"


def test_client_key_without_cert_is_refused(tmp_path):
    key = tmp_path / "key.pem"
    key.write_text("x")
    with pytest.raises(ConfigError, match="NOMAD_CLIENT_CERT"):
        NomadConfig.from_env({"NOMAD_CLIENT_KEY": str(key)})


def test_tls_files(tmp_path):
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    for f in (ca, cert, key):
        f.write_text("x")
    env = {"NOMAD_CACERT": str(ca), "NOMAD_CLIENT_CERT": str(cert), "NOMAD_CLIENT_KEY": str(key)}
    config = NomadConfig.from_env(env)
    assert (config.ca_cert, config.client_cert, config.client_key) == (str(ca), str(cert), str(key))
    # NOMAD_SKIP_VERIFY=false keeps verifying against the given CA.
    assert not NomadConfig.from_env({**env, "NOMAD_SKIP_VERIFY": "false"}).skip_verify
    assert NomadConfig.from_env({**env, "NOMAD_SKIP_VERIFY": "true"}).skip_verify


def test_token_not_in_repr_or_str():
    config = NomadConfig.from_env({"NOMAD_TOKEN": TOKEN})
    assert TOKEN not in repr(config)
    assert TOKEN not in str(config)
    assert config.token == TOKEN


def test_direct_construction_is_validated_and_normalised():
    assert NomadConfig(address="https://nomad.example/").address == "https://nomad.example:443"
    with pytest.raises(ConfigError):
        NomadConfig(address="nomad.example:4646")


def test_ssl_context_verifies_by_default():
    assert NomadConfig().ssl_context() is None  # plain http
    ctx = NomadConfig(address="https://nomad.example:4646").ssl_context()
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    skip = NomadConfig(address="https://nomad.example:4646", skip_verify=True).ssl_context()
    assert skip is not None
    assert skip.verify_mode == ssl.CERT_NONE
