"""Make sure the bucket of `SUMMARYD_LOGDIR` (s3://BUCKET/PREFIX) exists, then run the command given, if any.

    python3 ensure_bucket.py [COMMAND [ARG...]]

Waits until the S3 endpoint answers, creates the bucket unless it exists, and waits until listing it answers
steadily (just after start, SeaweedFS can still answer a listing with a transient 500); then replaces itself with
COMMAND, or exits 0. The endpoint and credentials come from the standard variables (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, ...). compose.yaml's `bucket` profile runs it as its one-shot bucket step, and before its
TensorBoard, whose reloader stops for good if its first listing finds no bucket.
"""

from __future__ import annotations

import os
import sys
import time
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

TIMEOUT_SECS = 180.0
STEADY_LISTINGS = 5
ALREADY_THERE = {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}


def ensure(bucket: str) -> str | None:
    """None once `bucket` exists and lists steadily; else why not, after TIMEOUT_SECS."""
    # One attempt per call: this loop does the waiting, with its own deadline.
    s3 = boto3.client("s3", config=Config(connect_timeout=2, read_timeout=10, retries={"total_max_attempts": 1}))
    deadline = time.monotonic() + TIMEOUT_SECS
    created = False
    steady = 0
    while steady < STEADY_LISTINGS:
        try:
            if not created:
                try:
                    s3.create_bucket(Bucket=bucket)
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") not in ALREADY_THERE:
                        raise
                created = True
            s3.list_objects_v2(Bucket=bucket, MaxKeys=1)
            steady += 1
        except (BotoCoreError, ClientError) as exc:
            if time.monotonic() > deadline:
                return f"not ready after {TIMEOUT_SECS:.0f} s: {exc}"
            steady = 0
            time.sleep(0.5)
    return None


def main(command: list[str]) -> int:
    logdir = os.environ.get("SUMMARYD_LOGDIR", "")
    url = urlsplit(logdir)
    if url.scheme != "s3" or not url.netloc:
        print(f"ensure_bucket: SUMMARYD_LOGDIR={logdir!r} is not s3://BUCKET/PREFIX", file=sys.stderr)
        return 2
    failure = ensure(url.netloc)
    if failure:
        print(f"ensure_bucket: bucket {url.netloc} {failure}", file=sys.stderr)
        return 1
    print(f"ensure_bucket: bucket {url.netloc} is ready", flush=True)
    if command:
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
