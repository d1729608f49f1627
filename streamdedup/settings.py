"""Streamdedup's settings: one frozen object, built once from flags and the environment.

Every field carries its CLI flag, its ``STREAMDEDUP_*`` environment variable, a help text and a
parser in its metadata, so the click options, the environment lookup and the checks all come from
one table.  Flags override the environment, which overrides the defaults.  Modules never read
``os.environ``: only the CLI passes it to :meth:`Settings.from_sources`.

>>> s = Settings.from_sources({"k": "2"}, {"STREAMDEDUP_BROKERS": "kafka://a:9092, b:9093"})
>>> s.k, s.brokers
(2, ('a:9092', 'b:9093'))
>>> Settings.from_sources({"k": "40"}, {})
Traceback (most recent call last):
...
streamdedup.errors.SettingsError: --k / STREAMDEDUP_K: 40 is out of range; use a small number of bits such as 3 (0..16)
"""

from __future__ import annotations

import difflib
import math
import os
import re
import ssl
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from streamdedup.engine.dedup import ALGORITHMS
from streamdedup.engine.records import DEFAULT_MAX_PAGE_BYTES
from streamdedup.errors import SettingsError
from streamdedup.fingerprinting.cluster import DEFAULT_CLUSTER_N, MAX_CLUSTER_N
from streamdedup.index.bands import DEFAULT_NUM_PERM
from streamdedup.index.tables import DESIGNS

__all__ = ["ENV_ALLOWLIST", "ENV_PREFIX", "Settings", "SettingsError"]

ENV_PREFIX = "STREAMDEDUP_"
#: ``STREAMDEDUP_*`` variables that are not settings yet must not be rejected as typos (e.g. read by
#: another tool).  Add a name with a comment saying who reads it.
ENV_ALLOWLIST: frozenset[str] = frozenset(
    {
        # streamdedup.fingerprinting.text, at import, in every process (the pool's too): "python" turns
        # the C text walk off (the same text, ~2x slower; for comparing the two)
        "STREAMDEDUP_HTML_WALK",
        # streamdedup.fingerprinting.kernels, on the first fingerprint: "numpy" turns the numba kernels
        # and the C word hashes off, "numba" the C word hashes only (the same bits; for comparing)
        "STREAMDEDUP_KERNELS",
    }
)
SSL_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
MASK = "***"
TOPIC_FIELDS = ("pages_topic", "unique_topic", "near_duplicate_topic", "verdicts_topic", "dead_letter_topic")


# ---------------------------------------------------------------------------- parsers
# A parser takes a string (flag or env var) or an already typed value (a default, a click bool
# flag, a programmatic argument) and returns the typed value, or raises ValueError saying what is
# wrong and how to fix it; _error() puts "--flag / STREAMDEDUP_FLAG: " in front.

Parser = Callable[[Any], Any]


def _int(lo: int, hi: int | None, hint: str) -> Parser:
    span = f"{lo}..{hi}" if hi is not None else f">= {lo}"

    def parse(v: Any) -> int:
        try:
            n = int(v.strip()) if isinstance(v, str) else v
        except ValueError:
            n = None
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"{v!r} is not a whole number; {hint} ({span})")
        if n < lo or (hi is not None and n > hi):
            raise ValueError(f"{n} is out of range; {hint} ({span})")
        return n

    return parse


def _float(lo: float, hi: float | None, hint: str, with_lo: bool = False) -> Parser:
    """The open interval (lo, hi), or [lo, hi) ``with_lo``; ``hi=None``: no upper bound."""
    low = f"{lo} <= x" if with_lo else f"{lo} < x"
    span = f"{low} < {hi}" if hi is not None else (f">= {lo}" if with_lo else f"> {lo}")

    def parse(v: Any) -> float:
        try:
            x = float(v.strip() if isinstance(v, str) else v)
        except (TypeError, ValueError):
            raise ValueError(f"{v!r} is not a number; {hint} ({span})") from None
        if (
            isinstance(v, bool)
            or not math.isfinite(x)
            or x < lo
            or (x == lo and not with_lo)
            or (hi is not None and x >= hi)
        ):
            raise ValueError(f"{v} is out of range; {hint} ({span})")
        return x

    return parse


def _choice(options: Collection[str], normalize: Callable[[str], str] = str.lower) -> Parser:
    def parse(v: Any) -> str:
        if (s := normalize(str(v).strip())) not in options:
            raise ValueError(f"{v!r} is not one of {'|'.join(options)}; use one of those")
        return s

    return parse


def _bool(v: Any) -> bool:
    s = str(v).strip().lower()  # str(True) == "True"
    if s not in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        raise ValueError(f"{v!r} is not a yes/no value; use true or false (also 1/0, yes/no)")
    return s in ("true", "1", "yes", "on")


def _text(v: Any) -> str:
    if not (s := str(v).strip()):
        raise ValueError("is empty; give a value, or leave the setting out for the default")
    return s


def _topic(max_len: int = 249) -> Parser:
    def parse(v: Any) -> str:
        s = str(v).strip()
        if not re.fullmatch(rf"[a-zA-Z0-9._-]{{1,{max_len}}}", s) or s in (".", ".."):
            raise ValueError(
                f"{s!r} is not a valid Kafka topic name; use 1..{max_len} of a-z A-Z 0-9 . _ - (not '.' or '..')"
            )
        return s

    return parse


def _brokers(v: Any) -> tuple[str, ...]:
    out = []
    for item in (str(i).strip() for i in (v.split(",") if isinstance(v, str) else v)):
        item = item[len("kafka://") :] if item.lower().startswith("kafka://") else item
        host, sep, port = item.rpartition(":")  # rpartition: "[::1]:9092" works too
        if item and (not host or not port.isdigit() or not 1 <= int(port) <= 65535):
            raise ValueError(f"{item!r} is not host:port; use e.g. 127.0.0.1:9092 (port 1..65535)")
        out += [item] if item else []
    if not out:
        raise ValueError("is empty; use a comma-separated list of host:port, e.g. 127.0.0.1:9092")
    return tuple(out)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _duration(v: Any) -> int:
    """A span of time as whole seconds: ``90d``, ``12h``, ``30m``, ``3600s``, ``2w`` or a bare number
    of seconds; ``0``, ``none``, ``off`` or ``forever`` mean no limit (0).

    >>> _duration("90d"), _duration("1.5h"), _duration("3600"), _duration("none")
    (7776000, 5400, 3600, 0)
    """
    s = str(v).strip().lower()
    if s in ("0", "none", "off", "forever", "never"):
        return 0
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([smhdw]?)", s)
    hint = "use a number and a unit s, m, h, d or w, such as 90d, 12h or 3600s (0 or none: keep pages forever)"
    if isinstance(v, bool) or m is None:
        raise ValueError(f"{v!r} is not a duration; {hint}")
    seconds = round(float(m[1]) * _DURATION_UNITS[m[2] or "s"])
    if seconds < 1:
        raise ValueError(f"{v!r} is shorter than a second; {hint}")
    return seconds


def _path(v: Any) -> Path:
    return Path(_text(v)).expanduser()


def _readable_file(v: Any) -> Path:
    if not (p := _path(v)).is_file():
        raise ValueError(f"{str(p)!r} is not a file; give the path of an existing file")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{str(p)!r} is not readable; fix its permissions or use another file")
    return p


def _optional(parse: Parser) -> Parser:
    """None or a blank string mean 'not set'."""
    return lambda v: None if v is None or (isinstance(v, str) and not v.strip()) else parse(v)


def _f(flag: str, default: Any, help: str, parse: Parser, metavar: str, *, secret: bool = False) -> Any:
    env = ENV_PREFIX + flag.removeprefix("--").replace("-", "_").upper()
    return field(
        default=default,
        metadata={"flag": flag, "env": env, "help": help, "parse": parse, "metavar": metavar, "secret": secret},
    )


_FILE = _optional(_readable_file)


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True, repr=False)
class Settings:
    """All of streamdedup's configuration; see the module docstring."""

    brokers: tuple[str, ...] = _f(
        "--brokers",
        ("127.0.0.1:9092",),
        "Kafka bootstrap servers, comma-separated host:port (kafka:// allowed).",
        _brokers,
        "HOST:PORT,...",
    )
    app_id: str = _f(
        "--app-id",
        "streamdedup",
        "Consumer group id and faust app id; also the prefix of internal topics.",
        _topic(200),
        "NAME",
    )  # 200: room for faust's topic suffixes
    pages_topic: str = _f("--pages-topic", "pages", "Topic of incoming pages.", _topic(), "TOPIC")
    unique_topic: str = _f("--unique-topic", "pages.unique", "Topic for unique pages.", _topic(), "TOPIC")
    near_duplicate_topic: str = _f(
        "--near-duplicate-topic", "pages.near-duplicate", "Topic for near-duplicate pages.", _topic(), "TOPIC"
    )
    verdicts_topic: str = _f("--verdicts-topic", "pages.verdicts", "Topic for verdicts.", _topic(), "TOPIC")
    dead_letter_topic: str = _f(
        "--dead-letter-topic", "pages.dead-letter", "Topic for bad records, with the reason.", _topic(), "TOPIC"
    )
    partitions: int = _f(
        "--partitions",
        8,
        "Partitions of the pages topic and the internal shard topics.",
        _int(1, None, "use at least 1, e.g. 8"),
        "INT",
    )
    replication_factor: int = _f(
        "--replication-factor",
        1,
        "Replication factor of created topics.",
        _int(1, 32767, "use 1 for one broker, 3 in production"),
        "INT",
    )
    algorithm: str = _f("--algorithm", "simhash", "Near-duplicate test.", _choice(ALGORITHMS), "|".join(ALGORITHMS))
    k: int = _f(
        "--k",
        3,
        "simhash: pages within k bits are near-duplicates; combined: the simhash filter on the LSH "
        "candidates (8-10 advised).",
        _int(0, 16, "use a small number of bits such as 3"),
        "INT",
    )
    design: str | None = _f(
        "--design",
        None,
        "Manku table design for k=3 (number of tables); default 4 in the worker (one table per shard "
        "group: ~50 B of RAM a page), 16 in scan.",
        _optional(_choice(DESIGNS)),
        "|".join(DESIGNS),
    )
    threshold: float = _f(
        "--threshold",
        0.8,
        "minhash/combined: resemblance needed for a near-duplicate.",
        _float(0, 1, "use a similarity such as 0.8"),
        "FLOAT",
    )
    num_perm: int = _f(
        "--num-perm",
        DEFAULT_NUM_PERM,
        "minhash/combined: hash functions per signature (the bands and the sketch that verifies).",
        _int(16, 1024, f"use e.g. {DEFAULT_NUM_PERM}"),
        "INT",
    )
    cluster_n: int = _f(
        "--cluster-n",
        DEFAULT_CLUSTER_N,
        "Shingle hashes in each verdict's cluster key (the XOR of the page's n smallest word-trigram "
        "hashes): pages of Jaccard similarity J share a key with probability about J**n; larger n joins "
        "fewer dissimilar pages and fewer near-duplicates (0: no key).",
        _int(0, MAX_CLUSTER_N, f"use e.g. {DEFAULT_CLUSTER_N}, or 0 to turn the key off"),
        "INT",
    )
    max_page_bytes: int = _f(
        "--max-page-bytes",
        DEFAULT_MAX_PAGE_BYTES,
        "Larger pages go to the dead-letter topic.",
        _int(1024, None, "use e.g. 5242880 (5 MiB)"),
        "BYTES",
    )
    batch_size: int = _f("--batch-size", 500, "Pages judged per batch.", _int(1, 100_000, "use e.g. 500"), "INT")
    batch_timeout: float = _f(
        "--batch-timeout",
        0.05,
        "Seconds to wait for a batch to fill.",
        _float(0, None, "use e.g. 0.05 seconds"),
        "SECONDS",
    )
    transaction_interval: float = _f(
        "--transaction-interval",
        0.1,
        "Least seconds between the starts of two transactions of one pages partition: verdicts "
        "ready sooner wait and go out together (fewer transactions, less CPU for the worker and "
        "the broker; 0: each goes out at once).",
        _float(0, 60, "use e.g. 0.1 seconds, or 0 for none", with_lo=True),
        "SECONDS",
    )
    fingerprint_processes: int = _f(
        "--fingerprint-processes",
        1,
        "Processes that extract the text and "
        "fingerprint pages while the worker's event loop talks to Kafka (0: in the "
        "event loop).",
        _int(0, 64, "use 1, or more on a machine with cores to spare"),
        "INT",
    )
    local_shards: bool = _f(
        "--local-shards",
        True,
        "Give this worker's probes to the shard partitions it owns itself, not through the probes and answers "
        "topics (the same verdicts, two Kafka round trips fewer for those probes).",
        _bool,
        "BOOL",
    )
    web_host: str = _f("--web-host", "127.0.0.1", "Bind address of the web server (/metrics).", _text, "HOST")
    web_port: int = _f(
        "--web-port",
        6066,
        "Port of the web server (/metrics).",
        _int(1, 65535, "use a free TCP port such as 6066"),
        "PORT",
    )
    data_dir: Path = _f("--data-dir", Path("streamdedup-data"), "Directory for local shard snapshots.", _path, "DIR")
    snapshot_interval: float = _f(
        "--snapshot-interval",
        300.0,
        "Seconds between local shard snapshots (a restart replays only the changelog after the last one).",
        _float(0, None, "use e.g. 300 seconds"),
        "SECONDS",
    )
    bulk_replay_min_records: int = _f(
        "--bulk-replay-min-records",
        1000,
        "A shard's changelog tail of at least this many records is replayed by the worker's own bulk "
        "reader before faust's recovery, which replays a shorter one, and whatever the bulk read left (0: always).",
        _int(0, None, "use e.g. 1000"),
        "INT",
    )
    bulk_replay_timeout: float = _f(
        "--bulk-replay-timeout",
        120.0,
        "Seconds the bulk changelog replay of one assignment may take; faust's recovery replays the rest "
        "(it also stops when the group rebalances).",
        _float(0, None, "use e.g. 120 seconds"),
        "SECONDS",
    )
    stop_timeout: float = _f(
        "--stop-timeout",
        25.0,
        "Seconds a stop (SIGTERM/SIGINT) may take before the worker exits anyway; nothing is lost, "
        "the pages not yet committed are judged again by whoever takes the partition (0: no limit).",
        _float(0, None, "use e.g. 25 seconds, below the orchestrator's grace period (30 s on Kubernetes)"),
        "SECONDS",
    )
    standby_replicas: int = _f(
        "--standby-replicas",
        0,
        "Warm copies of each shard on other workers (each costs the shard's memory again).",
        _int(0, 3, "use 0, or 1 for faster failover"),
        "INT",
    )
    session_timeout: int = _f(
        "--session-timeout",
        10,
        "Seconds before the group gives a silent worker's partitions to the others: a dead "
        "worker stalls every verdict for about this long.",
        _int(6, 1800, "use 6..1800 seconds, within the broker's group.min/max.session.timeout.ms"),
        "SECONDS",
    )
    retention: int = _f(
        "--retention",
        0,
        "Forget stored pages whose fetch time is this much older than the newest one a shard has stored "
        "(e.g. 90d, 12h, 3600s): they leave the index and the shard changelog, so memory stays bounded on a "
        "crawl that never ends; a later copy is judged and stored anew (0 or none: keep forever).",
        _duration,
        "DURATION",
    )
    index_memory_limit: int = _f(
        "--index-memory-limit",
        0,
        "Bytes the index may use on one worker, for the alert on memory (0: no limit).",
        _int(0, None, "use e.g. 4294967296 (4 GiB)"),
        "BYTES",
    )
    memory_limit: int = _f(
        "--memory-limit",
        0,
        "Bytes the worker's processes may use, for the alert on memory (0: the container's limit).",
        _int(0, None, "use e.g. 4831838208 (4.5 GiB)"),
        "BYTES",
    )
    log_level: str = _f(
        "--log-level",
        "info",
        "Logging level.",
        _choice(("debug", "info", "warning", "error")),
        "debug|info|warning|error",
    )
    security_protocol: str = _f(
        "--security-protocol",
        "PLAINTEXT",
        "How to talk to Kafka.",
        _choice(("PLAINTEXT", "SSL", *SASL_PROTOCOLS), str.upper),
        "PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL",
    )
    sasl_mechanism: str | None = _f(
        "--sasl-mechanism",
        None,
        "SASL mechanism (SASL_* protocols only).",
        _optional(_choice(SASL_MECHANISMS, str.upper)),
        "|".join(SASL_MECHANISMS),
    )
    sasl_username: str | None = _f("--sasl-username", None, "SASL user name.", _optional(_text), "USER")
    sasl_password: str | None = _f(
        "--sasl-password",
        None,
        "SASL password; prefer the env var or --sasl-password-file (flags show in the process list).",
        _optional(str),
        "PASSWORD",
        secret=True,
    )
    sasl_password_file: Path | None = _f(
        "--sasl-password-file", None, "File holding the SASL password, read once at start.", _FILE, "FILE"
    )
    ssl_cafile: Path | None = _f(
        "--ssl-cafile", None, "PEM CA bundle to verify the brokers (default: the system CAs).", _FILE, "FILE"
    )
    ssl_certfile: Path | None = _f(
        "--ssl-certfile", None, "PEM client certificate (with --ssl-keyfile).", _FILE, "FILE"
    )
    ssl_keyfile: Path | None = _f("--ssl-keyfile", None, "PEM client key (with --ssl-certfile).", _FILE, "FILE")
    ssl_key_password: str | None = _f(
        "--ssl-key-password", None, "Password of --ssl-keyfile.", _optional(str), "PASSWORD", secret=True
    )
    ssl_check_hostname: bool = _f(
        "--ssl-check-hostname", True, "Check that the broker certificate names the broker host.", _bool, "BOOL"
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _parse(f.name, getattr(self, f.name)))
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.design is not None and self.k != 3:
            raise _error("design", f"named designs are for k=3, not k={self.k}; drop --design or use --k 3")
        seen: dict[str, str] = {}
        for name in TOPIC_FIELDS:
            # Kafka refuses topics that differ only in '.' vs '_' (their metric names collide).
            if (key := getattr(self, name).replace(".", "_")) in seen:
                # blame the one that was set: a command without the other's flag (``produce``
                # has no --verdicts-topic) must not be told to change it
                other = seen[key]
                if getattr(self, name) == _default(name) and getattr(self, other) != _default(other):
                    name, other = other, name
                named = "'s default" if getattr(self, other) == _default(other) else ""
                alike = (
                    f" ({getattr(self, other)!r}: Kafka takes '.' and '_' as the same)"
                    if getattr(self, other) != getattr(self, name)
                    else ""
                )
                raise _error(
                    name,
                    f"{getattr(self, name)!r} is also {_meta(other)['flag']}{named}{alike} "
                    f"({_meta(other)['env']}); give every topic its own name",
                )
            seen[key] = name
        protocol = self.security_protocol
        sasl, tls = protocol in SASL_PROTOCOLS, protocol in SSL_PROTOCOLS
        for name, needed in (
            ("sasl_mechanism", "use SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN"),
            ("sasl_username", "give the user name"),
            ("sasl_password", "set STREAMDEDUP_SASL_PASSWORD or use --sasl-password-file"),
        ):
            if sasl and getattr(self, name) is None:
                raise _error(name, f"is required with {protocol}; {needed}")
        for name in SECURITY_FIELDS:
            kind, on = ("SASL", sasl) if name.startswith("sasl") else ("SSL", tls)
            if not on and getattr(self, name) is not None:
                raise _error(
                    name,
                    f"is only used with {kind} security protocols, not {protocol}; set --security-protocol or drop it",
                )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise _error(
                "ssl_keyfile" if self.ssl_keyfile is None else "ssl_certfile",
                "is missing; --ssl-certfile and --ssl-keyfile come together",
            )
        if self.ssl_key_password is not None and self.ssl_keyfile is None:
            raise _error("ssl_key_password", "needs --ssl-keyfile; give the key or drop the password")
        if tls:  # load the PEM files now: a bad file fails at start with a message, not at connect
            try:
                ssl.create_default_context(cafile=self.ssl_cafile)
            except (ssl.SSLError, OSError) as e:
                raise _error(
                    "ssl_cafile", f"cannot load CA certificates ({e}); use a PEM file of CA certificates"
                ) from None
            try:
                self.ssl_context()
            except (ssl.SSLError, OSError) as e:
                raise _error(
                    "ssl_certfile",
                    f"cannot load it with --ssl-keyfile ({e}); use a PEM "
                    "certificate, its key, and --ssl-key-password if the key is encrypted",
                ) from None

    @classmethod
    def from_sources(
        cls,
        flags: Mapping[str, Any],
        env: Mapping[str, str],
        *,
        allow_env: Collection[str] = ENV_ALLOWLIST,
        fields_used: Collection[str] | None = None,
    ) -> Settings:
        """Flags (keyed by field name; None = not given) override ``env``, which overrides defaults.

        ``fields_used``: the fields a command has (None: all); the environment's values of the
        others are not read (a worker's STREAMDEDUP_SECURITY_PROTOCOL must not stop ``scan``),
        though every STREAMDEDUP_* name must still be a setting's.

        >>> Settings.from_sources({}, {"STREAMDEDUP_KAY": "3"})
        Traceback (most recent call last):
        ...
        streamdedup.errors.SettingsError: STREAMDEDUP_KAY is not a streamdedup setting; did you mean STREAMDEDUP_K? ...
        """
        specs = {f.name: f.metadata for f in fields(cls)}
        if unknown := sorted(set(flags) - set(specs)):
            raise TypeError(f"not Settings fields: {', '.join(unknown)}")
        known = sorted(m["env"] for m in specs.values())
        for var in sorted(env):
            if var.startswith(ENV_PREFIX) and var not in known and var not in allow_env:
                close = difflib.get_close_matches(var, known, n=1)
                raise SettingsError(
                    f"{var} is not a streamdedup setting; "
                    + (f"did you mean {close[0]}? " if close else "")
                    + f"unset it or use one of: {', '.join(known)}"
                )
        raw = {
            name: flags[name] if flags.get(name) is not None else env[meta["env"]]
            for name, meta in specs.items()
            if flags.get(name) is not None or (meta["env"] in env and (fields_used is None or name in fields_used))
        }
        for name in TOPIC_FIELDS:
            # a command's topics are checked against the worker's (a topic it does not read,
            # from the environment when set and valid): ``produce --pages-topic pages.verdicts``
            # is fine when STREAMDEDUP_VERDICTS_TOPIC names another topic
            if name not in raw and (var := specs[name]["env"]) in env:
                try:
                    raw[name] = _parse(name, env[var])
                except SettingsError:
                    pass  # (not this command's to judge)
        if (path := _parse("sasl_password_file", raw.get("sasl_password_file"))) is not None:
            if _optional(str)(raw.get("sasl_password")) is not None:
                raise _error(
                    "sasl_password_file",
                    "and --sasl-password / STREAMDEDUP_SASL_PASSWORD are both set; use only one of them",
                )
            try:
                raw["sasl_password"] = path.read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as e:
                raise _error("sasl_password_file", f"cannot be read ({e}); use a readable UTF-8 file") from None
            if not raw["sasl_password"]:
                raise _error("sasl_password_file", f"{str(path)!r} is empty; put the password in it")
        return cls(**cast(dict[str, Any], raw))

    # ------------------------------------------------------------------ for logs and clients

    def describe(self) -> dict[str, Any]:
        """Every setting as a JSON-friendly value, safe to log: secrets are masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            v = MASK if f.metadata["secret"] and v is not None else v
            out[f.name] = list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v
        return out

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self.describe().items())})"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A new client context for SSL / SASL_SSL (system CAs unless ``ssl_cafile``), else None."""
        if self.security_protocol not in SSL_PROTOCOLS:
            return None
        # The standard library's verified client context (aiokafka's create_ssl_context builds the same).
        ctx = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile is not None:
            # never None: OpenSSL would prompt on the terminal for an encrypted key
            ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=self.ssl_key_password or "")
        ctx.check_hostname = self.ssl_check_hostname  # the chain is verified either way
        return ctx

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Connection kwargs for AIOKafkaProducer / AIOKafkaConsumer / AIOKafkaAdminClient."""
        kw: dict[str, Any] = {"bootstrap_servers": list(self.brokers), "security_protocol": self.security_protocol}
        if self.security_protocol in SASL_PROTOCOLS:
            kw.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        if self.security_protocol in SSL_PROTOCOLS:
            kw["ssl_context"] = self.ssl_context()
        return kw


#: The SASL and TLS credentials: each needs its security protocol (checked in ``_check_combinations``), and every
#: command that talks to Kafka takes them (``cli.options.CONNECTION``).
SECURITY_FIELDS = (
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "sasl_password_file",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_key_password",
)


def _meta(name: str) -> Mapping[str, Any]:
    return Settings.__dataclass_fields__[name].metadata


def _default(name: str) -> Any:
    return Settings.__dataclass_fields__[name].default


def _error(name: str, message: str) -> SettingsError:
    return SettingsError(f"{_meta(name)['flag']} / {_meta(name)['env']}: {message}")


def _parse(name: str, value: Any) -> Any:
    try:
        return _meta(name)["parse"](value)
    except ValueError as e:
        raise _error(name, str(e)) from None
