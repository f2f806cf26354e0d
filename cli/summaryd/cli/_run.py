"""`summaryd run`: a training command with torch's and tensorboardX's writers logging through summaryd."""

from __future__ import annotations

import argparse
import os

from summaryd.cli._commands import ADDRESS_HELP, ENV_PREFIX, Command, Subcommands, add_redirect_flag


def _add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    run: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="run a training command with torch's and tensorboardX's writers logging through summaryd",
        description="Run COMMAND with summaryd in place of torch.utils.tensorboard.SummaryWriter and "
        "tensorboardX.SummaryWriter (and their FileWriter): a sitecustomize put first on the child's PYTHONPATH "
        "patches them at start-up, so Lightning, Transformers and Ignite log to the daemon unchanged. A "
        "framework's local log_dir maps to a run below --run-root: relative paths as they are "
        "(lightning_logs/version_0) but for a first component naming a logdir root (runs/, torch's default, or "
        "the daemon's logdir by name: runs/linreg is linreg), one inside the daemon's logdir by its path there, "
        "other absolute ones relative to the working directory when below it, else whole without the leading "
        "'/'. Each rank of torchrun or accelerate launch writes to <run>/rank-N. With "
        "--ship DIR a shipper follows DIR beside the command, for writers in native code (tf.summary). Prints a "
        "banner, and at the end the writers' delivery report; exits with the command's code.",
        usage="summaryd run [--address A] [--run-root R] [--ship DIR [--state FILE]] -- COMMAND [ARG ...]",
    )
    run.add_argument("--address", default=None, help=ADDRESS_HELP)
    add_redirect_flag(run)
    run.add_argument(
        "--run-root",
        default=None,
        metavar="R",
        help=f"run path the local log_dirs go below (env {ENV_PREFIX}RUN_ROOT, default: none, the log_dir alone)",
    )
    run.add_argument("--ship", default=None, metavar="DIR", help="also ship the event files written under DIR")
    run.add_argument("--state", default=None, metavar="FILE", help="the shipper's checkpoint (see 'summaryd ship')")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command, after '--'")
    return run


def run(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    from pathlib import Path

    from summaryd.client.commands import resolve_addresses, resolve_redirect_allow, run_command

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        sub.error("give the command to run after '--', e.g. summaryd run -- python train.py")
    try:
        # Every address, in order: the command's writers and the shipper fail over between them.
        address = ",".join(resolve_addresses(args.address))
        redirect_allow = ",".join(resolve_redirect_allow(args.redirect_allow))
    except ValueError as exc:
        sub.error(str(exc))
    run_root = args.run_root if args.run_root is not None else os.environ.get(ENV_PREFIX + "RUN_ROOT", "")
    ship_dir = Path(args.ship) if args.ship else None
    state = Path(args.state) if args.state else None
    return run_command(
        command, address=address, run_root=run_root, ship_dir=ship_dir, state_path=state, redirect_allow=redirect_allow
    )


RUN = Command("run", _add_parser, run)
