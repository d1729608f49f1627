"""Settings: defaults, environment parsing, precedence, every check (raised and passing),
secrets, TLS contexts from real certificates, the faust/aiokafka views and the click options."""

from __future__ import annotations

import dataclasses
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from streamdedup.cli.options import settings_from_click, settings_options
from streamdedup.errors import SettingsError
from streamdedup.settings import ENV_PREFIX, MASK, TOPIC_FIELDS, Settings
from streamdedup.stream.connection import faust_broker_url, faust_credentials

FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
SASL = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "alice",
    "sasl_password": "pa ss-word",
}


def build(flags: dict | None = None, env: dict | None = None) -> Settings:
    return Settings.from_sources(flags or {}, env or {})


def names(field: str) -> tuple[str, str]:
    return FIELDS[field].metadata["flag"], FIELDS[field].metadata["env"]


# ---------------------------------------------------------------------------- certificates

EXT = """subjectAltName=DNS:localhost
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ec_key_and_csr(name: str, cn: str, cwd: Path) -> None:
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={cn}",
        cwd=cwd,
    )


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A CA, a server certificate for DNS:localhost and a client certificate, all signed by the CA,
    an encrypted copy of the client key (password "k3y-pass"), and a second, untrusted CA."""
    d = tmp_path_factory.mktemp("certs")
    (d / "ext.cnf").write_text(EXT)
    for ca in ("ca", "other-ca"):
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            "-days",
            "2",
            "-subj",
            f"/CN=streamdedup {ca}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            cwd=d,
        )
    for serial, (name, cn) in enumerate((("server", "localhost"), ("client", "streamdedup-client")), 2):
        _ec_key_and_csr(name, cn, d)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            str(serial),
            "-days",
            "2",
            "-out",
            f"{name}.pem",
            "-extfile",
            "ext.cnf",
            cwd=d,
        )
    _openssl("pkey", "-in", "client.key", "-aes256", "-passout", "pass:k3y-pass", "-out", "client-enc.key", cwd=d)
    (d / "garbage.pem").write_text("not a certificate\n")
    return {p.name: p for p in d.iterdir() if p.suffix in (".pem", ".key")}


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, hostname: str) -> dict:
    """A TLS handshake through memory buffers; returns the client certificate the server saw."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {c: False, s: False}
    for _ in range(10):
        for side in (c, s):
            if not done[side]:
                try:
                    side.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
            s_in.write(c_out.read())
            c_in.write(s_out.read())
        if all(done.values()):
            return s.getpeercert()
    raise AssertionError("handshake did not finish")


def _server_context(certs, *, require_client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs["server.pem"], certs["server.key"])
    if require_client_cert:
        ctx.load_verify_locations(certs["ca.pem"])
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _tls(certs, **extra) -> dict:
    return {"security_protocol": "SSL", "ssl_cafile": str(certs["ca.pem"]), **extra}


# ---------------------------------------------------------------------------- table and defaults


def test_defaults():
    s = build()
    assert s == Settings()
    assert s.brokers == ("127.0.0.1:9092",) and s.app_id == "streamdedup"
    assert [getattr(s, t) for t in TOPIC_FIELDS] == [
        "pages",
        "pages.unique",
        "pages.near-duplicate",
        "pages.verdicts",
        "pages.dead-letter",
    ]
    assert (s.partitions, s.replication_factor, s.algorithm, s.k, s.design) == (8, 1, "simhash", 3, None)
    assert (s.threshold, s.num_perm, s.max_page_bytes) == (0.8, 512, 5 * 1024 * 1024)
    assert (s.batch_size, s.batch_timeout, s.web_host, s.web_port) == (500, 0.05, "127.0.0.1", 6066)
    assert s.data_dir == Path("./streamdedup-data") and s.log_level == "info"
    assert (s.security_protocol, s.sasl_mechanism, s.sasl_username) == ("PLAINTEXT", None, None)
    assert s.sasl_password is None and s.ssl_cafile is None
    assert s.ssl_check_hostname is True and s.ssl_context() is None
    assert s.aiokafka_kwargs() == {"bootstrap_servers": ["127.0.0.1:9092"], "security_protocol": "PLAINTEXT"}
    assert faust_broker_url(s) == "kafka://127.0.0.1:9092" and faust_credentials(s) is None


def test_every_field_has_flag_env_help_and_parser():
    for name, f in FIELDS.items():
        m = f.metadata
        assert m["flag"] == "--" + name.replace("_", "-")
        assert m["env"] == ENV_PREFIX + name.upper()
        assert m["help"].endswith(".") and callable(m["parse"])


def test_frozen_and_replace_revalidates():
    s = build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.k = 4  # type: ignore[misc]
    assert dataclasses.replace(s, k=5).k == 5
    with pytest.raises(SettingsError, match="--k / STREAMDEDUP_K"):
        dataclasses.replace(s, k=40)


def test_importable_without_faust_or_aiokafka():
    code = (
        "import sys; sys.modules['faust'] = None\n"
        "from streamdedup.settings import Settings\n"
        "s = Settings.from_sources({}, {'STREAMDEDUP_K': '2'})\n"
        "assert s.k == 2 and 'aiokafka' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


# ---------------------------------------------------------------------------- sources


@pytest.mark.parametrize(
    "env, field, expected",
    [
        ({"STREAMDEDUP_PARTITIONS": " 12 "}, "partitions", 12),
        ({"STREAMDEDUP_MAX_PAGE_BYTES": "1_048_576"}, "max_page_bytes", 1 << 20),
        ({"STREAMDEDUP_THRESHOLD": "0.65"}, "threshold", 0.65),
        ({"STREAMDEDUP_BATCH_TIMEOUT": "1e-3"}, "batch_timeout", 0.001),
        (
            {"STREAMDEDUP_BROKERS": "kafka://a:9092, b.example:19092 ,KAFKA://[::1]:9093,"},
            "brokers",
            ("a:9092", "b.example:19092", "[::1]:9093"),
        ),
        ({"STREAMDEDUP_DATA_DIR": "/var/lib/sd"}, "data_dir", Path("/var/lib/sd")),
        ({"STREAMDEDUP_DATA_DIR": "~/sd"}, "data_dir", Path("~/sd").expanduser()),
        ({"STREAMDEDUP_ALGORITHM": "MinHash"}, "algorithm", "minhash"),
        ({"STREAMDEDUP_LOG_LEVEL": "WARNING"}, "log_level", "warning"),
        ({"STREAMDEDUP_DESIGN": ""}, "design", None),  # blank optional = not set
        ({"STREAMDEDUP_DESIGN": "20"}, "design", "20"),
    ],
)
def test_env_parsing(env, field, expected):
    assert getattr(build(env=env), field) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("on", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("off", False),
    ],
)
def test_env_bools(certs, text, expected):
    env = {
        "STREAMDEDUP_SSL_CHECK_HOSTNAME": text,
        "STREAMDEDUP_SECURITY_PROTOCOL": "ssl",
        "STREAMDEDUP_SSL_CAFILE": str(certs["ca.pem"]),
    }
    s = build(env=env)
    assert s.ssl_check_hostname is expected and s.ssl_context().check_hostname is expected


def test_flags_override_env_override_defaults():
    env = {"STREAMDEDUP_K": "5", "STREAMDEDUP_NUM_PERM": "64", "STREAMDEDUP_APP_ID": "from-env"}
    s = build({"k": "7", "app_id": None, "threshold": 0.5, "ssl_check_hostname": False}, env)
    assert (s.k, s.num_perm, s.app_id, s.threshold, s.batch_size) == (7, 64, "from-env", 0.5, 500)
    assert s.ssl_check_hostname is False  # a typed value (click's bool flag) is taken as is


def test_unknown_env_var_is_rejected_with_the_valid_names():
    with pytest.raises(SettingsError) as e:
        build(env={"STREAMDEDUP_TRESHOLD": "0.9"})
    msg = str(e.value)
    assert "STREAMDEDUP_TRESHOLD is not a streamdedup setting; did you mean STREAMDEDUP_THRESHOLD?" in msg
    assert all(f.metadata["env"] in msg for f in FIELDS.values()) and "\n" not in msg


def test_other_env_vars_and_the_allow_list_are_tolerated():
    env = {"PATH": "/bin", "STREAMDEDUPX": "1", "streamdedup_k": "9", "STREAMDEDUP_BENCH_DIR": "/tmp"}
    with pytest.raises(SettingsError, match="STREAMDEDUP_BENCH_DIR"):
        build(env=env)
    assert Settings.from_sources({}, env, allow_env={"STREAMDEDUP_BENCH_DIR"}).k == 3


@pytest.mark.parametrize("var", ["STREAMDEDUP_HTML_WALK", "STREAMDEDUP_KERNELS"])
def test_the_path_switches_are_not_taken_for_a_typo(var):
    # read by streamdedup.fingerprinting (text at import, kernels on first use), not settings, but
    # a worker and scan must start with them (kernels.py documents STREAMDEDUP_KERNELS=numpy)
    assert build(env={var: "numpy"}).k == 3


def test_unknown_flag_is_a_programming_error():
    with pytest.raises(TypeError, match="not Settings fields: kay"):
        build({"kay": 3})


# ---------------------------------------------------------------------------- every check
# (flags, field named in the message, a fix the message suggests); then the same rule passing.

BAD = [
    ({"brokers": "localhost"}, "brokers", "use e.g. 127.0.0.1:9092"),
    ({"brokers": "h:0"}, "brokers", "port 1..65535"),
    ({"brokers": "h:65536"}, "brokers", "port 1..65535"),
    ({"brokers": "h:http"}, "brokers", "port 1..65535"),
    ({"brokers": ":9092"}, "brokers", "use e.g. 127.0.0.1:9092"),
    ({"brokers": " , "}, "brokers", "comma-separated list of host:port"),
    ({"app_id": "my app"}, "app_id", "a-z A-Z 0-9 . _ -"),
    ({"app_id": "a" * 201}, "app_id", "use 1..200"),
    ({"pages_topic": "pages/in"}, "pages_topic", "a-z A-Z 0-9 . _ -"),
    ({"unique_topic": "."}, "unique_topic", "not '.' or '..'"),
    ({"near_duplicate_topic": ".."}, "near_duplicate_topic", "not '.' or '..'"),
    ({"verdicts_topic": "v" * 250}, "verdicts_topic", "use 1..249"),
    ({"dead_letter_topic": "dead letter"}, "dead_letter_topic", "a-z A-Z 0-9 . _ -"),
    ({"dead_letter_topic": "pages"}, "dead_letter_topic", "is also --pages-topic's default (STREAMDEDUP_PAGES_TOPIC)"),
    ({"verdicts_topic": "pages_unique"}, "verdicts_topic", "is also --unique-topic's default"),  # '.' ~ '_'
    # the one that was set is blamed (``produce`` has no --verdicts-topic to change)
    ({"pages_topic": "pages.verdicts"}, "pages_topic", "is also --verdicts-topic's default (STREAMDEDUP_VERDI"),
    ({"pages_topic": "x", "verdicts_topic": "x"}, "verdicts_topic", "is also --pages-topic (STREAMDEDUP_PAGES_T"),
    ({"partitions": "0"}, "partitions", "use at least 1"),
    ({"partitions": "eight"}, "partitions", "is not a whole number"),
    ({"replication_factor": "0"}, "replication_factor", "use 1 for one broker"),
    ({"algorithm": "lsh"}, "algorithm", "is not one of simhash|minhash|combined"),
    ({"k": "40"}, "k", "40 is out of range; use a small number of bits such as 3 (0..16)"),
    ({"k": "-1"}, "k", "(0..16)"),
    ({"k": "3.5"}, "k", "is not a whole number"),
    ({"k": True}, "k", "is not a whole number"),
    ({"design": "7"}, "design", "is not one of 20|16|10|4"),
    ({"design": "16", "k": "4"}, "design", "named designs are for k=3, not k=4; drop --design or use --k 3"),
    ({"threshold": "0"}, "threshold", "use a similarity such as 0.8 (0 < x < 1)"),
    ({"threshold": "1"}, "threshold", "(0 < x < 1)"),
    ({"threshold": "nan"}, "threshold", "out of range"),
    ({"threshold": "high"}, "threshold", "is not a number"),
    ({"num_perm": "15"}, "num_perm", "(16..1024)"),
    ({"num_perm": "1025"}, "num_perm", "use e.g. 512"),
    ({"max_page_bytes": "1023"}, "max_page_bytes", "(>= 1024)"),
    ({"batch_size": "0"}, "batch_size", "(1..100000)"),
    ({"batch_size": "100001"}, "batch_size", "use e.g. 500"),
    ({"batch_timeout": "0"}, "batch_timeout", "use e.g. 0.05 seconds (> 0)"),
    ({"batch_timeout": "inf"}, "batch_timeout", "out of range"),
    ({"transaction_interval": "-0.1"}, "transaction_interval", "use e.g. 0.1 seconds, or 0 for none (0 <= x < 60)"),
    ({"transaction_interval": "60"}, "transaction_interval", "out of range"),
    ({"web_host": " "}, "web_host", "is empty; give a value"),
    ({"web_port": "0"}, "web_port", "use a free TCP port such as 6066 (1..65535)"),
    ({"web_port": "65536"}, "web_port", "(1..65535)"),
    ({"data_dir": ""}, "data_dir", "is empty"),
    ({"log_level": "verbose"}, "log_level", "is not one of debug|info|warning|error"),
    ({"security_protocol": "TLS"}, "security_protocol", "is not one of PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL"),
    ({**SASL, "sasl_mechanism": "GSSAPI"}, "sasl_mechanism", "is not one of PLAIN|SCRAM-SHA-256|SCRAM-SHA-512"),
    ({**SASL, "sasl_mechanism": None}, "sasl_mechanism", "is required with SASL_PLAINTEXT; use SCRAM-SHA-512"),
    ({"sasl_mechanism": "PLAIN"}, "sasl_mechanism", "only used with SASL security protocols, not PLAINTEXT"),
    ({**SASL, "sasl_username": None}, "sasl_username", "is required with SASL_PLAINTEXT; give the user name"),
    ({"sasl_username": "alice"}, "sasl_username", "set --security-protocol or drop it"),
    ({**SASL, "sasl_password": None}, "sasl_password", "use --sasl-password-file"),
    ({"sasl_password": "x"}, "sasl_password", "only used with SASL"),
    ({"ssl_check_hostname": "maybe"}, "ssl_check_hostname", "use true or false"),
    ({"session_timeout": "5"}, "session_timeout", "use 6..1800 seconds, within the broker's group.min"),
    ({"session_timeout": "2.5"}, "session_timeout", "is not a whole number"),
]


@pytest.mark.parametrize("flags, field, fix", BAD, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(BAD)])
def test_bad_value_names_flag_env_and_fix(flags, field, fix):
    flag, env = names(field)
    with pytest.raises(SettingsError) as e:
        build(flags)
    assert str(e.value).startswith(f"{flag} / {env}: ") and fix in str(e.value)


def test_bad_value_from_env_names_both_too():
    with pytest.raises(SettingsError, match=r"^--num-perm / STREAMDEDUP_NUM_PERM: 9 is out of range"):
        build(env={"STREAMDEDUP_NUM_PERM": "9"})


GOOD = [
    ({"brokers": "kafka://a:1,b:65535,[::1]:9092"}, "brokers", ("a:1", "b:65535", "[::1]:9092")),
    ({"brokers": ["x:1", "kafka://y:2"]}, "brokers", ("x:1", "y:2")),
    ({"app_id": "a.b_c-1" + "a" * 193}, "app_id", "a.b_c-1" + "a" * 193),
    ({"pages_topic": "in." + "p" * 246}, "pages_topic", "in." + "p" * 246),
    (
        {"unique_topic": "u", "near_duplicate_topic": "n", "verdicts_topic": "v", "dead_letter_topic": "d"},
        "dead_letter_topic",
        "d",
    ),
    ({"partitions": "1"}, "partitions", 1),
    ({"replication_factor": "3"}, "replication_factor", 3),
    ({"algorithm": "combined"}, "algorithm", "combined"),
    ({"k": "0"}, "k", 0),
    ({"k": 16}, "k", 16),
    ({"design": "20", "k": "3"}, "design", "20"),
    ({"threshold": "0.999"}, "threshold", 0.999),
    ({"num_perm": "16"}, "num_perm", 16),
    ({"num_perm": "1024"}, "num_perm", 1024),
    ({"max_page_bytes": "1024"}, "max_page_bytes", 1024),
    ({"batch_size": "100000"}, "batch_size", 100_000),
    ({"batch_timeout": "0.001"}, "batch_timeout", 0.001),
    ({"transaction_interval": "0"}, "transaction_interval", 0.0),
    ({"transaction_interval": "59.9"}, "transaction_interval", 59.9),
    ({"web_host": "0.0.0.0"}, "web_host", "0.0.0.0"),
    ({"web_port": "65535"}, "web_port", 65535),
    ({"data_dir": "snapshots"}, "data_dir", Path("snapshots")),
    ({"log_level": "debug"}, "log_level", "debug"),
    ({**SASL, "security_protocol": "sasl_plaintext"}, "security_protocol", "SASL_PLAINTEXT"),
    ({**SASL, "sasl_mechanism": "scram-sha-256"}, "sasl_mechanism", "SCRAM-SHA-256"),
    ({**SASL, "sasl_mechanism": "PLAIN"}, "sasl_mechanism", "PLAIN"),
    (SASL, "sasl_username", "alice"),
    (SASL, "sasl_password", "pa ss-word"),
    ({"ssl_check_hostname": "no"}, "ssl_check_hostname", False),
    ({"session_timeout": "6"}, "session_timeout", 6),
]


@pytest.mark.parametrize("flags, field, expected", GOOD, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(GOOD)])
def test_good_value_passes(flags, field, expected):
    assert getattr(build(flags), field) == expected


# ---------------------------------------------------------------------------- files and TLS


def test_password_file_is_read_once_and_never_shown(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret with spaces \n")
    s = build({**SASL, "sasl_password": None}, {"STREAMDEDUP_SASL_PASSWORD_FILE": str(secret)})
    secret.write_text("changed later\n")
    assert s.sasl_password == "s3cret with spaces " and s.sasl_password_file == secret
    assert s.aiokafka_kwargs()["sasl_plain_password"] == "s3cret with spaces "
    assert "s3cret" not in repr(s) and "s3cret" not in json.dumps(s.describe())


@pytest.mark.parametrize(
    "make, fix",
    [
        (lambda p: p / "missing", "is not a file; give the path of an existing file"),
        (lambda p: p, "is not a file"),
        (lambda p: (p / "empty").write_text("\n") and p / "empty", "is empty; put the password in it"),
    ],
)
def test_password_file_errors(tmp_path, make, fix):
    with pytest.raises(SettingsError, match="^--sasl-password-file / STREAMDEDUP_SASL_PASSWORD_FILE: .*" + fix):
        build({**SASL, "sasl_password": None, "sasl_password_file": str(make(tmp_path))})


def test_unreadable_file():
    """Root reads any file, so the check runs in a child process that drops to ``nobody``."""
    folder = Path(tempfile.mkdtemp(prefix="sd-unreadable-"))
    try:
        folder.chmod(0o755)
        p = folder / "pw"
        p.write_text("x")
        p.chmod(0)
        code = (
            "import os\n"
            "from streamdedup.errors import SettingsError\nfrom streamdedup.settings import Settings\n"
            "if os.geteuid() == 0:\n"
            "    os.setgid(65534); os.setuid(65534)  # nobody, after the imports\n"
            "try:\n"
            f"    Settings.from_sources({{'security_protocol': 'SASL_PLAINTEXT', 'sasl_mechanism': 'PLAIN',"
            f" 'sasl_username': 'u', 'sasl_password_file': {str(p)!r}}}, {{}})\n"
            "except SettingsError as e:\n"
            "    print(e)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
        assert "is not readable; fix its permissions" in out.stdout, out.stderr
    finally:
        shutil.rmtree(folder)


def test_password_and_password_file_together_is_an_error(tmp_path):
    (tmp_path / "pw").write_text("a")
    with pytest.raises(SettingsError, match="^--sasl-password-file / .*both set; use only one of them"):
        build({**SASL, "sasl_password_file": str(tmp_path / "pw")})
    with pytest.raises(SettingsError, match="only used with SASL"):  # a file without SASL
        build({"sasl_password_file": str(tmp_path / "pw")})


def test_secrets_are_masked(certs):
    s = build({**SASL, "sasl_password": "hunter2-sasl"})
    t = build(
        _tls(
            certs,
            ssl_certfile=str(certs["client.pem"]),
            ssl_keyfile=str(certs["client-enc.key"]),
            ssl_key_password="k3y-pass",
        )
    )
    for settings, secret, field in ((s, "hunter2-sasl", "sasl_password"), (t, "k3y-pass", "ssl_key_password")):
        assert secret not in repr(settings) and secret not in str(settings)
        assert settings.describe()[field] == MASK and f"{field}='***'" in repr(settings)
        assert secret not in json.dumps(settings.describe())
    assert "hunter2" not in repr(faust_credentials(s))
    assert build().describe()["sasl_password"] is None  # unset is not shown as set


def test_describe_is_json_friendly():
    d = build().describe()
    assert d["brokers"] == ["127.0.0.1:9092"] and d["data_dir"] == "streamdedup-data"
    assert json.loads(json.dumps(d)) == d and set(d) == set(FIELDS)


def test_ssl_context_from_real_certificates(certs):
    s = build(_tls(certs, ssl_certfile=str(certs["client.pem"]), ssl_keyfile=str(certs["client.key"])))
    ctx = s.ssl_context()
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    seen = _handshake(ctx, _server_context(certs, require_client_cert=True), "localhost")
    assert dict(x[0] for x in seen["subject"])["commonName"] == "streamdedup-client"
    assert s.ssl_context() is not ctx  # a fresh context per client


def test_check_hostname_is_honoured(certs):
    server = _server_context(certs, require_client_cert=False)
    checking = build(_tls(certs)).ssl_context()
    with pytest.raises(ssl.SSLCertVerificationError, match="(?i)hostname mismatch"):
        _handshake(checking, server, "broker.example")
    relaxed = build(_tls(certs, ssl_check_hostname="false")).ssl_context()
    assert relaxed.check_hostname is False
    _handshake(relaxed, server, "broker.example")
    # The chain is still verified without the hostname check: another CA is refused.
    other = build(_tls(certs, ssl_cafile=str(certs["other-ca.pem"]), ssl_check_hostname="false")).ssl_context()
    with pytest.raises(ssl.SSLCertVerificationError, match="(?i)certificate verify failed"):
        _handshake(other, server, "localhost")


def test_encrypted_client_key(certs):
    tls = _tls(certs, ssl_certfile=str(certs["client.pem"]), ssl_keyfile=str(certs["client-enc.key"]))
    ctx = build({**tls, "ssl_key_password": "k3y-pass"}).ssl_context()
    _handshake(ctx, _server_context(certs, require_client_cert=True), "localhost")
    for password in (None, "wrong"):  # never an interactive prompt
        with pytest.raises(SettingsError, match="^--ssl-certfile / .*--ssl-key-password if the key is encrypt"):
            build({**tls, "ssl_key_password": password})


@pytest.mark.parametrize(
    "change, field, fix",
    [
        ({"ssl_cafile": "garbage.pem"}, "ssl_cafile", "cannot load CA certificates"),
        ({"ssl_cafile": "missing.pem"}, "ssl_cafile", "is not a file"),
        ({"ssl_certfile": "client.pem"}, "ssl_keyfile", "is missing; --ssl-certfile and --ssl-keyfile come"),
        ({"ssl_keyfile": "client.key"}, "ssl_certfile", "is missing; --ssl-certfile and --ssl-keyfile come"),
        ({"ssl_key_password": "x"}, "ssl_key_password", "needs --ssl-keyfile"),
        ({"ssl_certfile": "client.pem", "ssl_keyfile": "server.key"}, "ssl_certfile", "its key"),  # mismatched
        ({"security_protocol": "PLAINTEXT"}, "ssl_cafile", "only used with SSL security protocols, not PLAINTEXT"),
        ({"security_protocol": "SASL_PLAINTEXT", **SASL}, "ssl_cafile", "only used with SSL"),
    ],
)
def test_tls_file_errors(certs, tmp_path, change, field, fix):
    files = {**certs, "missing.pem": tmp_path / "missing.pem"}
    flags = {**_tls(certs), **{k: str(files.get(v, v)) for k, v in change.items()}}
    flag, env = names(field)
    with pytest.raises(SettingsError) as e:
        build(flags)
    assert str(e.value).startswith(f"{flag} / {env}: ") and fix in str(e.value)


def test_ssl_without_cafile_uses_the_system_cas():
    ctx = build({"security_protocol": "SSL"}).ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


# ---------------------------------------------------------------------------- aiokafka and faust views


def test_aiokafka_kwargs(certs):
    kw = build({**SASL, "brokers": "a:1,b:2"}).aiokafka_kwargs()
    assert kw == {
        "bootstrap_servers": ["a:1", "b:2"],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "pa ss-word",
    }
    kw = build({**SASL, **_tls(certs), "security_protocol": "SASL_SSL"}).aiokafka_kwargs()
    assert kw["security_protocol"] == "SASL_SSL" and isinstance(kw["ssl_context"], ssl.SSLContext)
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512"
    kw = build(_tls(certs)).aiokafka_kwargs()
    assert set(kw) == {"bootstrap_servers", "security_protocol", "ssl_context"}


@pytest.mark.parametrize(
    "protocol, mechanism",
    [
        ("PLAINTEXT", None),
        ("SSL", None),
        *[(p, m) for p in ("SASL_PLAINTEXT", "SASL_SSL") for m in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")],
    ],
)
def test_faust_credentials_become_our_aiokafka_kwargs(certs, protocol, mechanism):
    """faust's own translation of our credentials equals aiokafka_kwargs(): one truth, two views."""
    import faust
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
    from faust.types.auth import SASLMechanism

    flags = {"security_protocol": protocol}
    if "SSL" in protocol:
        flags.update(_tls(certs), security_protocol=protocol)
    if "SASL" in protocol:
        flags.update({**SASL, "sasl_mechanism": mechanism, "security_protocol": protocol})
    s = build(flags)
    creds = faust_credentials(s)
    ours = {k: v for k, v in s.aiokafka_kwargs().items() if k not in ("bootstrap_servers", "ssl_context")}
    theirs = credentials_to_aiokafka_auth(creds)
    assert {k: v for k, v in theirs.items() if k != "ssl_context" and v is not None} == ours
    assert isinstance(theirs.get("ssl_context"), ssl.SSLContext) == ("SSL" in protocol)
    if protocol == "SSL":
        assert isinstance(creds, faust.SSLCredentials)
    elif "SASL" in protocol:
        assert isinstance(creds, faust.SASLCredentials) and creds.mechanism is SASLMechanism(mechanism)
    else:
        assert creds is None


@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[a-z][a-z0-9]{0,15}(\.[a-z][a-z0-9]{0,8}){0,2}", fullmatch=True), st.integers(1, 65535)
        ),
        min_size=1,
        max_size=4,
    )
)
def test_faust_parses_our_broker_url_back(hosts):
    from faust.transport.drivers.aiokafka import server_list
    from faust.utils.urls import urllist

    brokers = [f"{h}:{p}" for h, p in hosts]
    s = Settings.from_sources({"brokers": ",".join(brokers)}, {})
    assert server_list(urllist(faust_broker_url(s), default_scheme="kafka"), 9092) == brokers


# ---------------------------------------------------------------------------- click


@click.command()
@click.argument("name", required=False)
@settings_options
def _cmd(name, **params):
    s = settings_from_click(params)
    click.echo(json.dumps(s.describe()))


def test_click_bad_value_is_a_one_line_usage_error():
    result = CliRunner().invoke(_cmd, ["--k", "40"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: --k / STREAMDEDUP_K: 40 is out of range; use a small number of bits such as 3 (0..16)"]
    assert "Traceback" not in result.output


def test_click_bad_env_value_and_unknown_env_var():
    result = CliRunner(env={"STREAMDEDUP_WEB_PORT": "99999"}).invoke(_cmd, [])
    assert result.exit_code == 2
    assert "Error: --web-port / STREAMDEDUP_WEB_PORT: 99999 is out of range" in result.output
    result = CliRunner(env={"STREAMDEDUP_WEBPORT": "1"}).invoke(_cmd, [])
    assert result.exit_code == 2 and "did you mean STREAMDEDUP_WEB_PORT?" in result.output
    assert "Traceback" not in result.output


def test_click_flags_env_and_other_params():
    runner = CliRunner(env={"STREAMDEDUP_K": "5", "STREAMDEDUP_NUM_PERM": "64"})
    result = runner.invoke(_cmd, ["page-name", "--k", "2", "--no-ssl-check-hostname", "--brokers", "a:1,b:2"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert (d["k"], d["num_perm"], d["ssl_check_hostname"], d["brokers"]) == (2, 64, False, ["a:1", "b:2"])


def test_click_help_lists_every_flag_and_env_var():
    result = CliRunner().invoke(_cmd, ["--help"], terminal_width=1000)
    assert result.exit_code == 0
    for f in FIELDS.values():
        assert f.metadata["flag"] in result.output and f.metadata["env"] in result.output
    assert "--no-ssl-check-hostname" in result.output and "[default: 3; env: STREAMDEDUP_K]" in result.output


# ---------------------------------------------------------------------------- topic clashes of a command
# A command checks its topics against the worker's: the ones it does not read come from the
# environment when set (and valid there), else their defaults.


def test_a_command_checks_its_topic_against_the_workers_from_the_environment():
    from streamdedup.cli.options import PRODUCE, VERDICTS

    flags = {"pages_topic": "pages.verdicts"}
    ok = Settings.from_sources(flags, {"STREAMDEDUP_VERDICTS_TOPIC": "v"}, fields_used=PRODUCE)
    assert ok.pages_topic == "pages.verdicts"
    with pytest.raises(SettingsError, match=r"^--pages-topic / STREAMDEDUP_PAGES_TOPIC: .*--verdicts-topic's default"):
        Settings.from_sources(flags, {}, fields_used=PRODUCE)
    # a bad value of a topic the command does not read is not the command's to refuse
    ok = Settings.from_sources({}, {"STREAMDEDUP_VERDICTS_TOPIC": "no such/name"}, fields_used=PRODUCE)
    assert ok.verdicts_topic == "pages.verdicts"
    # `verdicts` with the worker's pages topic renamed: its verdicts topic may be called "pages"
    env = {"STREAMDEDUP_PAGES_TOPIC": "crawl", "STREAMDEDUP_VERDICTS_TOPIC": "pages"}
    assert Settings.from_sources({}, env, fields_used=VERDICTS).verdicts_topic == "pages"


def test_a_clash_of_dot_and_underscore_says_so():
    with pytest.raises(
        SettingsError, match=r"'pages_verdicts' is also --verdicts-topic's default \('pages.verdicts': Kafka takes"
    ):
        Settings.from_sources({"pages_topic": "pages_verdicts"}, {})
