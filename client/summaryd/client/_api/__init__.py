"""What the writer API (`writer`, `hooks`, `keras`) is built of: the summary builders (torch's, or numpy-only
ones), the embedding projector's files, and the TensorFlow hook classes.

The public modules stay where users import them from (`summaryd.client.writer`, `.hooks`, `.keras`); the
parts here are private and may change.
"""
