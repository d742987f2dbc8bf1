"""Triton's sizing flags that its qa scripts pass: accepted, reported as not active."""


def test_triton_tuning_flags_used_by_its_qa_scripts_are_accepted_and_reported():
    """Triton's qa scripts pass --http-thread-count (L0_http, L0_grpc ...); nursery accepts
    such sizing flags and reports them as not active instead of refusing to start."""
    from nursery.settings import settings_from_args

    settings = settings_from_args(["--http-thread-count=4", "--grpc-infer-allocation-pool-size",
                                   "16", "--enable-peer-access=false",
                                   "--min-supported-compute-capability=6.0"])
    assert {"--http-thread-count", "--grpc-infer-allocation-pool-size", "--enable-peer-access",
            "--min-supported-compute-capability"} <= set(settings.inactive)
