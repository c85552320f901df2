"""Gateway settings (pydantic-settings; ``SLUICE_`` prefix, ``__`` nests).

Example: ``SLUICE_REDIS__URL=redis://10.0.0.5:6379/0 SLUICE_HTTP__PORT=8000 sluice gateway``.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sluice.broker.latency_window import parse_quantiles
from sluice.broker.logs import LogOptions
from sluice.broker.settings import RedisSettings
from sluice.broker.tracing import DEFAULT_OTLP_URL

#: Triton's trace levels (``--trace-config level=``); ``OFF`` traces nothing.
TRACE_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")


class HttpSettings(BaseModel):
    """The HTTP/REST front end (Triton ``--http-*`` flags)."""

    enabled: bool = True
    """Triton ``--allow-http``."""
    address: str = "0.0.0.0"
    """Triton ``--http-address``."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Triton ``--http-port``."""
    max_body_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """Largest accepted request body, in bytes; a larger one is refused with 400."""
    read_timeout_s: float = Field(default=60.0, gt=0)
    """Sluice ``--http-read-timeout-secs``: longest wait for the next bytes of a request
    whose head or body has begun (then 408 and close), or for a new connection's first
    bytes (then close), in s."""
    restricted_apis: list[str] = Field(default_factory=list)
    """Triton ``--http-restricted-api``: ``<api-group>[,<api-group>…]:<header>=<value>`` each."""


class GrpcSettings(BaseModel):
    """The gRPC front end (Triton ``--grpc-*`` flags, ``src/command_line_parser.cc``)."""

    reuse_port: bool = False
    """Share the port with other gateway processes (set from ``GatewaySettings.reuse_port``)."""
    enabled: bool = True
    """Triton ``--allow-grpc``."""
    address: str = "0.0.0.0"
    """Triton ``--grpc-address``."""
    port: int = Field(default=8001, ge=0, le=65535)
    """Triton ``--grpc-port``."""
    keepalive_time_ms: int = Field(default=7_200_000, gt=0)
    """Triton ``--grpc-keepalive-time`` (``grpc.keepalive_time_ms``)."""
    keepalive_timeout_ms: int = Field(default=20_000, gt=0)
    """Triton ``--grpc-keepalive-timeout`` (``grpc.keepalive_timeout_ms``)."""
    keepalive_permit_without_calls: bool = False
    """Triton ``--grpc-keepalive-permit-without-calls``."""
    http2_max_pings_without_data: int = Field(default=2, ge=0)
    """Triton ``--grpc-http2-max-pings-without-data``."""
    http2_min_recv_ping_interval_without_data_ms: int = Field(default=300_000, ge=0)
    """Triton ``--grpc-http2-min-recv-ping-interval-without-data``."""
    http2_max_ping_strikes: int = Field(default=2, ge=0)
    """Triton ``--grpc-http2-max-ping-strikes``."""
    use_ssl: bool = False
    """Triton ``--grpc-use-ssl``."""
    use_ssl_mutual: bool = False
    """Triton ``--grpc-use-ssl-mutual`` (implies ``use_ssl``; clients must present a cert)."""
    server_cert: str = ""
    """Triton ``--grpc-server-cert``: PEM file of the server certificate."""
    server_key: str = ""
    """Triton ``--grpc-server-key``: PEM file of the server key."""
    root_cert: str = ""
    """Triton ``--grpc-root-cert``: PEM file of the root certificate (client checks)."""
    infer_response_compression_level: Literal["none", "low", "medium", "high"] = "none"
    """Triton ``--grpc-infer-response-compression-level`` (any level but ``none`` = gzip)."""
    restricted_protocols: list[str] = Field(default_factory=list)
    """Triton ``--grpc-restricted-protocol``: ``<api-group>[,…]:<header>=<value>`` each."""


class MetricsSettings(BaseModel):
    """The Prometheus metrics endpoint (Triton ``--allow-metrics``, ``--metrics-*`` flags)."""

    enabled: bool = True
    """Triton ``--allow-metrics``."""
    address: str = ""
    """Triton ``--metrics-address``; empty = the HTTP address."""
    port: int = Field(default=8002, ge=0, le=65535)
    """Triton ``--metrics-port``."""
    gpu: bool = True
    """Triton ``--allow-gpu-metrics`` (only where pynvml finds a GPU)."""
    cpu: bool = True
    """Triton ``--allow-cpu-metrics`` (Linux ``/proc``)."""
    interval_ms: float = Field(default=2000, gt=0)
    """Triton ``--metrics-interval-ms``: how often GPU and CPU gauges are refreshed, in ms."""
    counter_latencies: bool = True
    """Triton ``--metrics-config counter_latencies``: the five ``*_duration_us`` counters."""
    summary_latencies: bool = False
    """Triton ``--metrics-config summary_latencies``: the five ``*_summary_us`` summaries
    (quantiles over the last 60 s, ``broker.latency_window``)."""
    summary_quantiles: str = "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001"
    """Triton ``--metrics-config summary_quantiles``: ``<quantile>:<error>`` pairs, comma
    separated (Triton core's default); the errors are accepted and not needed (the
    quantiles are read off a histogram, exact to within 0.8% of their value)."""
    histogram_latencies: bool = False
    """Triton ``--metrics-config histogram_latencies``: accepted, not implemented (logged)."""

    @field_validator("summary_quantiles")
    @classmethod
    def _quantiles(cls, value: str) -> str:
        parse_quantiles(value)  # ValueError names the pair
        return value


class JobSettings(BaseModel):
    """The async job API (docs/user-guide/jobs.md)."""

    result_ttl_s: int = Field(default=86_400, gt=0)
    """How long a finished job's record and results are kept, in s, unless the job
    asks for another (``ttl_secs``, at most ``max_ttl_s``)."""
    max_ttl_s: int = Field(default=30 * 86_400, gt=0)
    """The longest ``ttl_secs`` a job may ask for, in s."""
    timeout_s: int = Field(default=86_400, gt=0)
    """How long a job may take from its submission, in s; past it, it fails with
    "Request timeout expired"."""


class TraceConfig(BaseModel):
    """Triton's trace settings at start-up (``--trace-config``; docs/user-guide/tracing.md,
    Triton ``docs/user_guide/trace.md``). The trace extension changes level, rate, count
    and log frequency at run time (:mod:`api.trace_settings`)."""

    mode: Literal["triton", "opentelemetry"] = "triton"
    """``mode=``: ``triton`` writes Triton's JSON trace file, ``opentelemetry`` exports
    spans over OTLP/HTTP."""
    level: list[str] = Field(default_factory=lambda: ["OFF"])
    """``level=`` (repeatable): ``OFF``, ``TIMESTAMPS``, ``TENSORS``."""
    rate: int = Field(default=1000, ge=0)
    """``rate=``: one request in ``rate`` is traced (0: only requests that carry a W3C
    ``traceparent``, in OpenTelemetry mode)."""
    count: int = Field(default=-1, ge=-1)
    """``count=``: traces still to collect (-1: no limit)."""
    file: str = ""
    """``triton,file=``: the trace file (Triton mode)."""
    log_frequency: int = Field(default=0, ge=0)
    """``triton,log-frequency=``: write the file every this many traces, to
    ``<file>.<n>`` (0: once, at exit)."""
    url: str = DEFAULT_OTLP_URL
    """``opentelemetry,url=``: the OTLP/HTTP endpoint spans are exported to."""
    resource: list[str] = Field(default_factory=list)
    """``opentelemetry,resource=<key>=<value>`` (repeatable): resource attributes."""
    bsp_max_queue_size: int | None = Field(default=None, gt=0)
    """``opentelemetry,bsp_max_queue_size=``: the batch span processor's queue (SDK
    default 2048)."""
    bsp_schedule_delay_ms: int | None = Field(default=None, gt=0)
    """``opentelemetry,bsp_schedule_delay=``: longest wait between exports, in ms (SDK
    default 5000)."""
    bsp_max_export_batch_size: int | None = Field(default=None, gt=0)
    """``opentelemetry,bsp_max_export_batch_size=``: spans per export (SDK default 512)."""

    @field_validator("level")
    @classmethod
    def _levels(cls, value: list[str]) -> list[str]:
        for level in value:
            if level not in TRACE_LEVELS:
                raise ValueError(
                    f"unsupported trace level '{level}', expected one of {', '.join(TRACE_LEVELS)}"
                )
        return value


class GatewaySettings(BaseSettings):
    """Everything one gateway process needs."""

    model_config = SettingsConfigDict(
        env_prefix="SLUICE_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    redis: RedisSettings = RedisSettings()
    http: HttpSettings = HttpSettings()
    grpc: GrpcSettings = GrpcSettings()
    metrics: MetricsSettings = MetricsSettings()
    jobs: JobSettings = JobSettings()
    trace: TraceConfig = TraceConfig()
    gateway_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Names this gateway's reply key; unique per process."""
    server_id: str = "triton"
    """Server metadata ``name`` (Triton ``--id``)."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """Longest a request may wait for its answer when the client sets no timeout, in seconds."""
    cache_size_bytes: int = Field(default=0, ge=0)
    """Triton ``--cache-config local,size=<bytes>``: the response cache's size in bytes,
    shared by every gateway through Redis (0: no cache; ``broker.response_cache``)."""
    exit_timeout_s: float = Field(default=30.0, ge=0)
    """Triton ``--exit-timeout-secs``: at shutdown, how long in-flight requests are waited
    for (HTTP connections and gRPC calls) before they are answered UNAVAILABLE, in s."""
    reuse_port: bool = False
    """Bind the HTTP and gRPC ports with SO_REUSEPORT so several gateway processes share them
    (``sluice serve --gateway-processes N`` sets ``SLUICE_REUSE_PORT``)."""
    control_timeout_s: float = Field(default=600.0, gt=0)
    """Longest a load or unload request waits for the supervisor, in seconds."""
    model_cache_s: float = Field(default=0.5, ge=0)
    """How long a gateway reuses a model's config and states before reading Redis again, in s."""
    strict_readiness: bool = True
    """Triton ``--strict-readiness``: ready only when every model with a state is READY."""
    log_verbose: int = Field(default=0, ge=0)
    """Triton ``--log-verbose``."""
    log_info: bool = True
    """Triton ``--log-info`` (``SLUICE_LOG_INFO``)."""
    log_warning: bool = True
    """Triton ``--log-warning`` (``SLUICE_LOG_WARNING``)."""
    log_error: bool = True
    """Triton ``--log-error`` (``SLUICE_LOG_ERROR``)."""
    log_format: Literal["default", "ISO8601"] = "default"
    """Triton ``--log-format`` (``SLUICE_LOG_FORMAT``)."""
    log_file: str = ""
    """Triton ``--log-file`` (``SLUICE_LOG_FILE``); empty = standard error."""
    dashboard_history_s: int = Field(default=600, gt=0)
    """How much history the ``/dashboard`` plots keep in this gateway's memory, in seconds."""

    def log_options(self) -> LogOptions:
        """The logging flags as :class:`broker.logs.LogOptions`."""
        return LogOptions(
            verbose=self.log_verbose,
            info=self.log_info,
            warning=self.log_warning,
            error=self.log_error,
            format=self.log_format,
            file=self.log_file,
        )
