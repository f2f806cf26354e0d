from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClientIdentity(_message.Message):
    __slots__ = ("host", "pid", "framework", "version")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    host: str
    pid: int
    framework: str
    version: str
    def __init__(self, host: _Optional[str] = ..., pid: _Optional[int] = ..., framework: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("session_id", "run", "worker", "world_size", "client", "next_sequence", "session_started", "aggregate_off", "aggregate_tags")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SESSION_STARTED_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_OFF_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_TAGS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run: str
    worker: str
    world_size: int
    client: ClientIdentity
    next_sequence: int
    session_started: float
    aggregate_off: bool
    aggregate_tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., run: _Optional[str] = ..., worker: _Optional[str] = ..., world_size: _Optional[int] = ..., client: _Optional[_Union[ClientIdentity, _Mapping]] = ..., next_sequence: _Optional[int] = ..., session_started: _Optional[float] = ..., aggregate_off: _Optional[bool] = ..., aggregate_tags: _Optional[_Iterable[str]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("run_dir", "last_sequence", "lease_seconds", "max_message_bytes", "max_event_bytes", "max_batch_events", "takes_scalar_columns", "durable_acks", "durable_sequence", "pacing", "takes_fixed_steps")
    RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TAKES_SCALAR_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_ACKS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PACING_FIELD_NUMBER: _ClassVar[int]
    TAKES_FIXED_STEPS_FIELD_NUMBER: _ClassVar[int]
    run_dir: str
    last_sequence: int
    lease_seconds: float
    max_message_bytes: int
    max_event_bytes: int
    max_batch_events: int
    takes_scalar_columns: bool
    durable_acks: bool
    durable_sequence: int
    pacing: Pacing
    takes_fixed_steps: bool
    def __init__(self, run_dir: _Optional[str] = ..., last_sequence: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., max_message_bytes: _Optional[int] = ..., max_event_bytes: _Optional[int] = ..., max_batch_events: _Optional[int] = ..., takes_scalar_columns: _Optional[bool] = ..., durable_acks: _Optional[bool] = ..., durable_sequence: _Optional[int] = ..., pacing: _Optional[_Union[Pacing, _Mapping]] = ..., takes_fixed_steps: _Optional[bool] = ...) -> None: ...

class Pacing(_message.Message):
    __slots__ = ("linger_seconds", "max_in_flight")
    LINGER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    linger_seconds: float
    max_in_flight: int
    def __init__(self, linger_seconds: _Optional[float] = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("session_id", "first_sequence", "events", "scalars")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    first_sequence: int
    events: _containers.RepeatedScalarFieldContainer[bytes]
    scalars: ScalarColumns
    def __init__(self, session_id: _Optional[str] = ..., first_sequence: _Optional[int] = ..., events: _Optional[_Iterable[bytes]] = ..., scalars: _Optional[_Union[ScalarColumns, _Mapping]] = ...) -> None: ...

class ScalarColumns(_message.Message):
    __slots__ = ("tags", "tag_index", "step", "wall_time", "value", "fixed_step")
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TAG_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FIXED_STEP_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    tag_index: _containers.RepeatedScalarFieldContainer[int]
    step: _containers.RepeatedScalarFieldContainer[int]
    wall_time: _containers.RepeatedScalarFieldContainer[float]
    value: _containers.RepeatedScalarFieldContainer[float]
    fixed_step: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tags: _Optional[_Iterable[str]] = ..., tag_index: _Optional[_Iterable[int]] = ..., step: _Optional[_Iterable[int]] = ..., wall_time: _Optional[_Iterable[float]] = ..., value: _Optional[_Iterable[float]] = ..., fixed_step: _Optional[_Iterable[int]] = ...) -> None: ...

class WriteAck(_message.Message):
    __slots__ = ("acked_sequence", "durable_sequence", "pacing")
    ACKED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DURABLE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PACING_FIELD_NUMBER: _ClassVar[int]
    acked_sequence: int
    durable_sequence: int
    pacing: Pacing
    def __init__(self, acked_sequence: _Optional[int] = ..., durable_sequence: _Optional[int] = ..., pacing: _Optional[_Union[Pacing, _Mapping]] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ("session_id", "durable")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    durable: bool
    def __init__(self, session_id: _Optional[str] = ..., durable: _Optional[bool] = ...) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("acked_sequence",)
    ACKED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    acked_sequence: int
    def __init__(self, acked_sequence: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("acked_sequence", "events_written")
    ACKED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    acked_sequence: int
    events_written: int
    def __init__(self, acked_sequence: _Optional[int] = ..., events_written: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("changes_after",)
    CHANGES_AFTER_FIELD_NUMBER: _ClassVar[int]
    changes_after: int
    def __init__(self, changes_after: _Optional[int] = ...) -> None: ...

class WatchFinding(_message.Message):
    __slots__ = ("rule", "run", "rank", "step", "value", "subject", "state", "summary", "fired_unix", "resolved_unix", "sequence")
    RULE_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    FIRED_UNIX_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_UNIX_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    rule: str
    run: str
    rank: str
    step: int
    value: float
    subject: str
    state: str
    summary: str
    fired_unix: float
    resolved_unix: float
    sequence: int
    def __init__(self, rule: _Optional[str] = ..., run: _Optional[str] = ..., rank: _Optional[str] = ..., step: _Optional[int] = ..., value: _Optional[float] = ..., subject: _Optional[str] = ..., state: _Optional[str] = ..., summary: _Optional[str] = ..., fired_unix: _Optional[float] = ..., resolved_unix: _Optional[float] = ..., sequence: _Optional[int] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_dir", "event_file", "events_written", "bytes_written", "sessions", "lease_holder", "staged_bytes", "last_upload_unix", "last_upload_age_seconds")
    RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    EVENT_FILE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_UPLOAD_UNIX_FIELD_NUMBER: _ClassVar[int]
    LAST_UPLOAD_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    run_dir: str
    event_file: str
    events_written: int
    bytes_written: int
    sessions: int
    lease_holder: str
    staged_bytes: int
    last_upload_unix: float
    last_upload_age_seconds: float
    def __init__(self, run_dir: _Optional[str] = ..., event_file: _Optional[str] = ..., events_written: _Optional[int] = ..., bytes_written: _Optional[int] = ..., sessions: _Optional[int] = ..., lease_holder: _Optional[str] = ..., staged_bytes: _Optional[int] = ..., last_upload_unix: _Optional[float] = ..., last_upload_age_seconds: _Optional[float] = ...) -> None: ...

class SessionStatus(_message.Message):
    __slots__ = ("session_id", "run_dir", "worker", "client", "acked_sequence", "events_written", "duplicates_dropped", "idle_seconds", "streaming", "aggregated", "lag_steps")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    ACKED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    AGGREGATED_FIELD_NUMBER: _ClassVar[int]
    LAG_STEPS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_dir: str
    worker: str
    client: ClientIdentity
    acked_sequence: int
    events_written: int
    duplicates_dropped: int
    idle_seconds: float
    streaming: bool
    aggregated: bool
    lag_steps: int
    def __init__(self, session_id: _Optional[str] = ..., run_dir: _Optional[str] = ..., worker: _Optional[str] = ..., client: _Optional[_Union[ClientIdentity, _Mapping]] = ..., acked_sequence: _Optional[int] = ..., events_written: _Optional[int] = ..., duplicates_dropped: _Optional[int] = ..., idle_seconds: _Optional[float] = ..., streaming: _Optional[bool] = ..., aggregated: _Optional[bool] = ..., lag_steps: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("logdir", "runs", "sessions", "version", "watching", "findings", "changes", "changes_through", "board")
    LOGDIR_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WATCHING_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    CHANGES_THROUGH_FIELD_NUMBER: _ClassVar[int]
    BOARD_FIELD_NUMBER: _ClassVar[int]
    logdir: str
    runs: _containers.RepeatedCompositeFieldContainer[RunStatus]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionStatus]
    version: str
    watching: bool
    findings: _containers.RepeatedCompositeFieldContainer[WatchFinding]
    changes: _containers.RepeatedCompositeFieldContainer[WatchFinding]
    changes_through: int
    board: BoardStatus
    def __init__(self, logdir: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[RunStatus, _Mapping]]] = ..., sessions: _Optional[_Iterable[_Union[SessionStatus, _Mapping]]] = ..., version: _Optional[str] = ..., watching: _Optional[bool] = ..., findings: _Optional[_Iterable[_Union[WatchFinding, _Mapping]]] = ..., changes: _Optional[_Iterable[_Union[WatchFinding, _Mapping]]] = ..., changes_through: _Optional[int] = ..., board: _Optional[_Union[BoardStatus, _Mapping]] = ...) -> None: ...

class BoardStatus(_message.Message):
    __slots__ = ("address", "runs", "runs_pending", "segments_pending")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    RUNS_PENDING_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    address: str
    runs: int
    runs_pending: int
    segments_pending: int
    def __init__(self, address: _Optional[str] = ..., runs: _Optional[int] = ..., runs_pending: _Optional[int] = ..., segments_pending: _Optional[int] = ...) -> None: ...

class PutFileRequest(_message.Message):
    __slots__ = ("session_id", "path", "content")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    path: str
    content: bytes
    def __init__(self, session_id: _Optional[str] = ..., path: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class PutFileResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RelayRequest(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[RelayBatch]
    def __init__(self, batches: _Optional[_Iterable[_Union[RelayBatch, _Mapping]]] = ...) -> None: ...

class RelayBatch(_message.Message):
    __slots__ = ("write", "authorization")
    WRITE_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    write: WriteRequest
    authorization: str
    def __init__(self, write: _Optional[_Union[WriteRequest, _Mapping]] = ..., authorization: _Optional[str] = ...) -> None: ...

class RelayAck(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[RelaySessionAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[RelaySessionAck, _Mapping]]] = ...) -> None: ...

class RelaySessionAck(_message.Message):
    __slots__ = ("session_id", "ack", "code", "message", "refused_sequence")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    ack: WriteAck
    code: int
    message: str
    refused_sequence: int
    def __init__(self, session_id: _Optional[str] = ..., ack: _Optional[_Union[WriteAck, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., refused_sequence: _Optional[int] = ...) -> None: ...
