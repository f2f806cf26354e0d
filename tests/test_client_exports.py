"""The client's public names are pinned: removing or renaming one breaks users, so it must be deliberate."""

from __future__ import annotations

import summaryd.client
from summaryd.client import _sender

PUBLIC = {
    "DeliveryReport",
    "GlobalStep",
    "MonitoredLoop",
    "SecondOrStepTimer",
    "Sender",
    "SessionRunArgs",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "StepCounterHook",
    "SummarySaverHook",
    "SummaryWriter",
    "SummaryWriterCache",
    "create_global_step",
    "get_global_step",
    "patch",
    "reset_global_step",
}


def test_the_client_exports_exactly_its_public_names() -> None:
    assert set(summaryd.client.__all__) == PUBLIC
    # The two TF hooks resolve on first access (which may import TensorFlow): not resolved here.
    for name in PUBLIC - {"StepCounterHook", "SummarySaverHook"}:
        assert getattr(summaryd.client, name) is not None, name


def test_the_sender_package_exports_what_the_rest_of_the_client_uses() -> None:
    """`_sender` is a package of layers behind one curated `__init__`; the client imports from that alone."""
    assert set(_sender.__all__) == {
        "OVERFLOW_POLICIES",
        "REFUSED_SEQUENCE_KEY",
        "VERSION",
        "DeliveryReport",
        "EventSource",
        "Overflow",
        "Queued",
        "Sender",
    }
    assert _sender.Sender is summaryd.client.Sender
    assert _sender.DeliveryReport is summaryd.client.DeliveryReport
    # The key the daemon names a refused event with is the one the proto documents.
    from summaryd.server.errors import REFUSED_SEQUENCE_KEY

    assert _sender.REFUSED_SEQUENCE_KEY == REFUSED_SEQUENCE_KEY


def test_the_commands_module_exports_what_the_command_line_uses() -> None:
    """`summaryd.cli` reaches the client through `summaryd.client.commands` alone (`test_layers`)."""
    from summaryd.client import commands

    assert set(commands.__all__) == {
        "ChannelSettings",
        "RedirectRefusedError",
        "ReplayResult",
        "ShipError",
        "ShipTotals",
        "Shipper",
        "open_channel",
        "replay",
        "resolve_address",
        "resolve_addresses",
        "resolve_redirect_allow",
        "run_command",
    }
    for name in commands.__all__:
        assert getattr(commands, name) is not None, name
