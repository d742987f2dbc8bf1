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
            "--min-supported-compute-capability", "--grpc-infer-response-compression-level",
            "--model-load-retry-count"} <= set(settings.inactive)


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
