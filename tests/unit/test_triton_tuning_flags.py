"""Triton's sizing flags that its qa scripts pass: accepted, reported as not active."""


def test_triton_tuning_flags_used_by_its_qa_scripts_are_accepted_and_reported():
    """Triton's qa scripts pass --http-thread-count (L0_http, L0_grpc ...); nursery accepts
    such sizing flags and reports them as not active instead of refusing to start."""
    from nursery.settings import settings_from_args

    settings = settings_from_args(["--http-thread-count=4", "--grpc-infer-allocation-pool-size",
                                   "16", "--enable-peer-access=false",
                                   "--min-supported-compute-capability=6.0",
                                   "--grpc-infer-response-compression-level=high",
                                   "--model-load-retry-count=1"])
    assert {"--http-thread-count", "--grpc-infer-allocation-pool-size", "--enable-peer-access",
            "--min-supported-compute-capability"} <= set(settings.inactive)


def test_triton_start_flags_are_read():
    """--model-config-name, --reuse-*-port, --grpc-infer-response-compression-level and
    --model-load-retry-count and --model-namespacing take effect."""
    import pytest

    from nursery.settings import FlagError, settings_from_args

    settings = settings_from_args([
        "--model-config-name=h100", "--reuse-http-port=true", "--reuse-grpc-port",
        "--grpc-infer-response-compression-level=medium", "--model-load-retry-count=3",
        "--model-namespacing=false"])
    assert settings.model_config_name == "h100"
    assert settings.reuse_http_port and settings.reuse_grpc_port
    assert settings.grpc_response_compression == "medium"
    assert settings.model_load_retry_count == 3
    assert not settings.model_namespacing and "--model-namespacing" not in settings.inactive
    namespaced = settings_from_args(["--model-namespacing=true"])
    assert namespaced.model_namespacing and "--model-namespacing" not in namespaced.inactive
    assert settings_from_args([]).model_config_name == ""
    for bad in (["--model-config-name=a b"], ["--model-config-name="],
                ["--model-config-name", ""], ["--model-load-retry-count=-1"],
                ["--grpc-infer-response-compression-level=max"]):
        with pytest.raises(FlagError):
            settings_from_args(bad, raise_errors=True)


def test_config_file_prefers_the_custom_name(tmp_path):
    from nursery.config.model import config_file

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "h100.pbtxt").write_text("")
    assert config_file(tmp_path, "h100") == "configs/h100.pbtxt"
    assert config_file(tmp_path, "a100") == "config.pbtxt"
    assert config_file(tmp_path) == "config.pbtxt"


def test_deprecated_strict_model_config_warns_in_tritons_words():
    """tritonserver prints these two lines on stderr (L0_model_config's cli_messages grep
    for them); --disable-auto-complete-config wins over --strict-model-config=false."""
    from nursery.settings import settings_from_args

    assert settings_from_args([]).cli_warnings == ()
    deprecated = ("Warning: '--strict-model-config' has been deprecated! Please use "
                  "'--disable-auto-complete-config' instead.")
    settings = settings_from_args(["--strict-model-config=true"])
    assert settings.cli_warnings == (deprecated,) and not settings.auto_complete
    settings = settings_from_args(["--disable-auto-complete-config",
                                   "--strict-model-config=false"])
    assert settings.cli_warnings == (
        deprecated, "Warning: Overriding deprecated '--strict-model-config' from False to True "
        "in favor of '--disable-auto-complete-config'!")
    assert not settings.auto_complete



def test_mode_flags_are_read_in_any_case():
    """Triton lower-cases the values of --model-control-mode, --rate-limit and
    --grpc-infer-response-compression-level (L0_model_namespacing passes
    --model-control-mode=POLL)."""
    import pytest

    from nursery.settings import FlagError, settings_from_args

    settings = settings_from_args(["--model-control-mode=POLL", "--rate-limit=Execution_Count",
                                   "--grpc-infer-response-compression-level=HIGH"])
    assert settings.model_control_mode == "poll"
    assert settings.rate_limit == "execution_count"
    assert settings.grpc_response_compression == "high"
    assert settings_from_args(["--model-control-mode", "Explicit"]).model_control_mode == \
        "explicit"
    with pytest.raises(FlagError):
        settings_from_args(["--model-control-mode=POLLING"], raise_errors=True)


# every long option of Triton's command_line_parser.cc (server repository, 2.51 era)
TRITON_FLAGS = (
    "--allow-client-shm", "--allow-cpu-metrics", "--allow-gpu-metrics", "--allow-grpc",
    "--allow-http", "--allow-metrics", "--allow-sagemaker", "--allow-vertex-ai",
    "--backend-config", "--backend-directory", "--buffer-manager-thread-count",
    "--cache-config", "--cache-directory", "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size", "--disable-auto-complete-config", "--enable-peer-access",
    "--exit-on-error", "--exit-timeout-secs", "--grpc-address",
    "--grpc-header-forward-pattern", "--grpc-http2-max-ping-strikes",
    "--grpc-infer-thread-count", "--grpc-keepalive-time", "--grpc-keepalive-timeout",
    "--grpc-max-connection-age", "--grpc-max-response-pool-size", "--grpc-port",
    "--grpc-restricted-protocol", "--grpc-root-cert", "--grpc-server-cert",
    "--grpc-server-key", "--grpc-use-ssl", "--grpc-use-ssl-mutual", "--help", "--host-policy",
    "--http-address", "--http-header-forward-pattern", "--http-max-input-size", "--http-port",
    "--http-restricted-api", "--http-thread-count", "--id", "--load-model", "--log-error",
    "--log-file", "--log-format", "--log-info", "--log-verbose", "--log-warning",
    "--metrics-address", "--metrics-config", "--metrics-interval-ms", "--metrics-port",
    "--model-config-name", "--model-control-mode", "--model-load-gpu-limit",
    "--model-load-retry-count", "--model-load-thread-count", "--model-namespacing",
    "--model-repository", "--model-store", "--pinned-memory-pool-byte-size", "--rate-limit",
    "--rate-limit-resource", "--repoagent-directory", "--repository-poll-secs",
    "--response-cache-byte-size", "--reuse-grpc-port", "--reuse-http-port", "--sagemaker-port",
    "--sagemaker-safe-port-range", "--sagemaker-thread-count", "--strict-model-config",
    "--strict-readiness", "--trace-config", "--trace-count", "--trace-file", "--trace-level",
    "--trace-log-frequency", "--trace-rate", "--vertex-ai-default-model", "--vertex-ai-port",
    "--vertex-ai-thread-count",
)


def test_every_flag_of_tritons_command_line_is_known():
    """A Triton start-up script must not be refused for a flag nursery does not know (an
    unknown flag stops the start: L0_decoupled's --grpc-max-response-pool-size=1 did)."""
    from nursery.settings import build_parser

    parser = build_parser("python -m nursery serve", True)
    known = {o for action in parser._actions for o in action.option_strings}
    assert [f for f in TRITON_FLAGS if f not in known] == []


def test_sizes_tritonserver_refuses_stop_the_start():
    """--grpc-infer-thread-count outside 2..128 and a --grpc-max-response-pool-size below 1
    stop tritonserver's start (L0_sequence_stress expects it for -1, 0, 1 and 129); nursery
    accepts both flags without using them, and refuses the same values."""
    import pytest

    from nursery.settings import FlagError, settings_from_args

    for bad in ("-1", "0", "1", "129", "two"):
        with pytest.raises(FlagError, match="grpc.infer.thread.count"):
            settings_from_args([f"--grpc-infer-thread-count={bad}"], raise_errors=True)
    for bad in ("0", "-3"):
        with pytest.raises(FlagError, match="greater than 0"):
            settings_from_args([f"--grpc-max-response-pool-size={bad}"], raise_errors=True)
    for good in ("2", "128"):
        assert "--grpc-infer-thread-count" in settings_from_args(
            [f"--grpc-infer-thread-count={good}"]).inactive
    assert "--grpc-max-response-pool-size" in settings_from_args(
        ["--grpc-max-response-pool-size=1"]).inactive
