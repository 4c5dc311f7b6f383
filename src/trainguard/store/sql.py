"""Every SQL statement the store runs: schema migrations and queries, in one place.

Kept portable on purpose: the control plane will run the same schema on
PostgreSQL. The rules that make that work:

* parameters are named (``:name``), which a PostgreSQL driver gets by a
  mechanical rewrite to ``%(name)s``;
* column types come from :data:`SQLITE_TYPES` placeholders (``{id_pk}``,
  ``{float}``, ``{json}``), so a dialect is a different mapping, not a different schema;
* upserts use ``INSERT ... ON CONFLICT (...) DO UPDATE`` and new ids come back
  with ``RETURNING id`` (SQLite >= 3.35 and PostgreSQL both have them);
* things only one dialect can say (SQLite's ``RAISE`` triggers that make the
  audit log append-only) are in ``Migration.sqlite_only``; the PostgreSQL
  port supplies its own equivalent (a trigger function).

Times are ``{float}`` seconds since the epoch; JSON is stored as text.
"""

from __future__ import annotations

from dataclasses import dataclass

SQLITE_TYPES = {"id_pk": "INTEGER PRIMARY KEY", "float": "REAL", "json": "TEXT"}


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]
    sqlite_only: tuple[str, ...] = ()


MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at {float} NOT NULL
)"""

SELECT_SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_migrations"
INSERT_MIGRATION = (
    "INSERT INTO schema_migrations (version, description, applied_at)"
    " VALUES (:version, :description, :applied_at)"
)

_APPEND_ONLY_TRIGGERS = tuple(
    f"""CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table}
BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"""
    for table in ("audit", "device_health")
    for op in ("UPDATE", "DELETE")
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="jobs, attempts, incidents, devices, device health history, audit log",
        statements=(
            """CREATE TABLE jobs (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                command {json} NOT NULL,
                need INTEGER NOT NULL,
                min_need INTEGER,
                mode TEXT NOT NULL,
                checkpoint_dir TEXT,
                state TEXT NOT NULL,
                created_at {float} NOT NULL,
                updated_at {float},
                ended_at {float},
                reason TEXT
            )""",
            """CREATE TABLE attempts (
                job_id TEXT NOT NULL REFERENCES jobs (id),
                number INTEGER NOT NULL,
                devices {json} NOT NULL,
                state TEXT NOT NULL,
                started_at {float} NOT NULL,
                ended_at {float},
                exit_code INTEGER,
                signal INTEGER,
                checkpoint_path TEXT,
                checkpoint_step INTEGER,
                first_step INTEGER,
                first_step_at {float},
                last_step INTEGER,
                last_step_at {float},
                log_path TEXT,
                reason TEXT,
                PRIMARY KEY (job_id, number)
            )""",
            """CREATE TABLE incidents (
                id {id_pk},
                job_id TEXT NOT NULL REFERENCES jobs (id),
                attempt INTEGER NOT NULL,
                kind TEXT NOT NULL,
                domain TEXT NOT NULL,
                state TEXT NOT NULL,
                culprit_device_uuid TEXT,
                culprit_pci_bus_id TEXT,
                culprit_rank INTEGER,
                culprit_host TEXT,
                summary TEXT NOT NULL,
                fault_at {float},
                detected_at {float} NOT NULL,
                acted_at {float},
                recovered_at {float},
                closed_at {float},
                checkpoint_path TEXT,
                checkpoint_step INTEGER,
                failed_step INTEGER,
                lost_steps INTEGER,
                recovery_attempt INTEGER,
                signature TEXT,
                confidence {float},
                actions {json} NOT NULL,
                evidence {json} NOT NULL,
                plan {json},
                plan_generation INTEGER NOT NULL,
                timeline {json} NOT NULL,
                attribution {json},
                repair TEXT,
                reason TEXT
            )""",
            "CREATE INDEX incidents_job ON incidents (job_id, attempt)",
            """CREATE TABLE devices (
                uuid TEXT PRIMARY KEY,
                host TEXT NOT NULL,
                idx INTEGER NOT NULL,
                pci_bus_id TEXT NOT NULL,
                model TEXT NOT NULL,
                memory_mb INTEGER NOT NULL,
                state TEXT NOT NULL,
                reason TEXT,
                since {float} NOT NULL,
                first_seen {float} NOT NULL,
                last_seen {float} NOT NULL
            )""",
            """CREATE TABLE audit (
                id {id_pk},
                at {float} NOT NULL,
                actor TEXT NOT NULL,
                kind TEXT NOT NULL,
                subject TEXT NOT NULL,
                message TEXT NOT NULL,
                data {json} NOT NULL,
                job_id TEXT,
                incident_id INTEGER
            )""",
            "CREATE INDEX audit_at ON audit (at)",
            "CREATE INDEX audit_subject ON audit (subject)",
            """CREATE TABLE device_health (
                id {id_pk},
                device_uuid TEXT NOT NULL REFERENCES devices (uuid),
                at {float} NOT NULL,
                old_state TEXT,
                new_state TEXT NOT NULL,
                reason TEXT NOT NULL,
                actor TEXT NOT NULL,
                job_id TEXT,
                incident_id INTEGER,
                audit_id INTEGER REFERENCES audit (id)
            )""",
            "CREATE INDEX device_health_uuid ON device_health (device_uuid, id)",
        ),
        sqlite_only=_APPEND_ONLY_TRIGGERS,
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version


def render(statement: str, types: dict[str, str] = SQLITE_TYPES) -> str:
    """Fill the type placeholders of a DDL statement for one dialect."""
    return statement.format(**types)


# --- jobs ----------------------------------------------------------------------------

JOB_COLUMNS = (
    "id, name, command, need, min_need, mode, checkpoint_dir, state,"
    " created_at, updated_at, ended_at, reason"
)
INSERT_JOB = (
    f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES (:id, :name, :command, :need, :min_need, :mode,"
    " :checkpoint_dir, :state, :created_at, :updated_at, :ended_at, :reason)"
)
SELECT_JOB = f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = :id"
SELECT_JOBS = f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY created_at, id"
UPDATE_JOB_STATE = (
    "UPDATE jobs SET state = :state, updated_at = :at, ended_at = :ended_at,"
    " reason = COALESCE(:reason, reason) WHERE id = :id"
)

# --- attempts ------------------------------------------------------------------------

ATTEMPT_COLUMNS = (
    "job_id, number, devices, state, started_at, ended_at, exit_code, signal,"
    " checkpoint_path, checkpoint_step, first_step, first_step_at, last_step, last_step_at,"
    " log_path, reason"
)
INSERT_ATTEMPT = (
    f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (:job_id, :number, :devices, :state,"
    " :started_at, NULL, NULL, NULL, :checkpoint_path, :checkpoint_step, NULL, NULL, NULL, NULL,"
    " :log_path, NULL)"
)
SELECT_ATTEMPT = (
    f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = :job_id AND number = :number"
)
SELECT_ATTEMPTS = f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = :job_id ORDER BY number"
UPDATE_ATTEMPT_PROGRESS = (
    "UPDATE attempts SET"
    " first_step = COALESCE(first_step, :step),"
    " first_step_at = COALESCE(first_step_at, :at),"
    " last_step = :step, last_step_at = :at"
    " WHERE job_id = :job_id AND number = :number"
)
UPDATE_ATTEMPT_STATE = (
    "UPDATE attempts SET state = :state, ended_at = :ended_at,"
    " exit_code = COALESCE(:exit_code, exit_code), signal = COALESCE(:signal, signal),"
    " reason = COALESCE(:reason, reason)"
    " WHERE job_id = :job_id AND number = :number"
)
UPDATE_ATTEMPT_CHECKPOINT = (
    "UPDATE attempts SET checkpoint_path = :checkpoint_path, checkpoint_step = :checkpoint_step"
    " WHERE job_id = :job_id AND number = :number"
)

# --- incidents -----------------------------------------------------------------------

INCIDENT_COLUMNS = (
    "id, job_id, attempt, kind, domain, state, culprit_device_uuid, culprit_pci_bus_id,"
    " culprit_rank, culprit_host, summary, fault_at, detected_at, acted_at, recovered_at,"
    " closed_at, checkpoint_path, checkpoint_step, failed_step, lost_steps, recovery_attempt,"
    " signature, confidence, actions, evidence, plan, plan_generation, timeline, attribution,"
    " repair, reason"
)
INSERT_INCIDENT = (
    "INSERT INTO incidents (job_id, attempt, kind, domain, state, culprit_device_uuid,"
    " culprit_pci_bus_id, culprit_rank, culprit_host, summary, fault_at, detected_at,"
    " failed_step, signature, confidence, actions, evidence, plan, plan_generation, timeline,"
    " attribution, repair)"
    " VALUES (:job_id, :attempt, :kind, :domain, :state, :culprit_device_uuid,"
    " :culprit_pci_bus_id, :culprit_rank, :culprit_host, :summary, :fault_at, :detected_at,"
    " :failed_step, :signature, :confidence, :actions, :evidence, NULL, 0, :timeline,"
    " :attribution, :repair)"
    " RETURNING id"
)
SELECT_INCIDENT = f"SELECT {INCIDENT_COLUMNS} FROM incidents WHERE id = :id"
SELECT_INCIDENTS = (
    f"SELECT {INCIDENT_COLUMNS} FROM incidents"
    " WHERE (:job_id IS NULL OR job_id = :job_id) AND (:state IS NULL OR state = :state)"
    " ORDER BY id"
)
# The whole mutable part of an incident is rewritten from the record the store
# computed inside the transaction; one statement keeps the update atomic.
UPDATE_INCIDENT = (
    "UPDATE incidents SET state = :state, fault_at = :fault_at, acted_at = :acted_at,"
    " recovered_at = :recovered_at, closed_at = :closed_at, checkpoint_path = :checkpoint_path,"
    " checkpoint_step = :checkpoint_step, failed_step = :failed_step, lost_steps = :lost_steps,"
    " recovery_attempt = :recovery_attempt, actions = :actions, evidence = :evidence,"
    " plan = :plan, plan_generation = :plan_generation, timeline = :timeline,"
    " repair = :repair, reason = :reason"
    " WHERE id = :id"
)

# --- devices -------------------------------------------------------------------------

DEVICE_COLUMNS = (
    "uuid, host, idx, pci_bus_id, model, memory_mb, state, reason, since, first_seen, last_seen"
)
SELECT_DEVICE = f"SELECT {DEVICE_COLUMNS} FROM devices WHERE uuid = :uuid"
SELECT_DEVICES = (
    f"SELECT {DEVICE_COLUMNS} FROM devices WHERE (:host IS NULL OR host = :host)"
    " ORDER BY host, idx, uuid"
)
SELECT_DEVICES_BY_PCI = (
    f"SELECT {DEVICE_COLUMNS} FROM devices WHERE pci_bus_id = :pci_bus_id ORDER BY host, uuid"
)
SELECT_DEVICES_BY_INDEX = (
    f"SELECT {DEVICE_COLUMNS} FROM devices WHERE idx = :idx"
    " AND (:host IS NULL OR host = :host) ORDER BY host, uuid"
)
INSERT_DEVICE = (
    f"INSERT INTO devices ({DEVICE_COLUMNS}) VALUES (:uuid, :host, :idx, :pci_bus_id, :model,"
    " :memory_mb, :state, :reason, :at, :at, :at)"
)
# A device seen again keeps its health state: only what the inventory reports changes.
UPDATE_DEVICE_SEEN = (
    "UPDATE devices SET host = :host, idx = :idx, pci_bus_id = :pci_bus_id, model = :model,"
    " memory_mb = :memory_mb, last_seen = :at WHERE uuid = :uuid"
)
UPDATE_DEVICE_STATE = (
    "UPDATE devices SET state = :state, reason = :reason, since = :at WHERE uuid = :uuid"
)
INSERT_HEALTH = (
    "INSERT INTO device_health (device_uuid, at, old_state, new_state, reason, actor, job_id,"
    " incident_id, audit_id) VALUES (:device_uuid, :at, :old_state, :new_state, :reason, :actor,"
    " :job_id, :incident_id, :audit_id) RETURNING id"
)
SELECT_HEALTH = (
    "SELECT id, device_uuid, at, old_state, new_state, reason, actor, job_id, incident_id,"
    " audit_id FROM device_health WHERE device_uuid = :uuid ORDER BY id"
)
SELECT_HEALTH_BY_INCIDENT = (
    "SELECT id, device_uuid, at, old_state, new_state, reason, actor, job_id, incident_id,"
    " audit_id FROM device_health WHERE incident_id = :incident_id ORDER BY id"
)

# --- audit ---------------------------------------------------------------------------

AUDIT_COLUMNS = "id, at, actor, kind, subject, message, data, job_id, incident_id"
INSERT_AUDIT = (
    "INSERT INTO audit (at, actor, kind, subject, message, data, job_id, incident_id)"
    " VALUES (:at, :actor, :kind, :subject, :message, :data, :job_id, :incident_id)"
    " RETURNING id"
)
# Filters are all optional: a NULL parameter switches its filter off. The store
# passes ``subject_like`` (an escaped LIKE prefix pattern) for a subject ending in
# ``*``, otherwise NULL. SQLite's LIMIT needs -1 for "no limit" (NO_LIMIT).
_AUDIT_WHERE = (
    " WHERE (:since IS NULL OR at >= :since) AND (:until IS NULL OR at < :until)"
    " AND (:kind IS NULL OR kind = :kind)"
    " AND (:subject IS NULL OR subject = :subject OR subject LIKE :subject_like ESCAPE '\\')"
    " AND (:job_id IS NULL OR job_id = :job_id)"
    " AND (:incident_id IS NULL OR incident_id = :incident_id)"
    " AND (:after_id IS NULL OR id > :after_id)"
)
SELECT_AUDIT_OLDEST = f"SELECT {AUDIT_COLUMNS} FROM audit{_AUDIT_WHERE} ORDER BY id LIMIT :limit"
SELECT_AUDIT_NEWEST = (
    f"SELECT {AUDIT_COLUMNS} FROM audit{_AUDIT_WHERE} ORDER BY id DESC LIMIT :limit"
)
COUNT_AUDIT = "SELECT COUNT(*) FROM audit"
NO_LIMIT = -1
