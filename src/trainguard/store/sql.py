"""Every query the store runs, grouped by concept; the schema is in :mod:`.schema`.

One place for SQL text: the store's modules (jobs, incidents, audit, health, and the
control plane's lease, ledger, approvals, ...) hold no SQL of their own. The rules
that keep one text valid on SQLite and PostgreSQL (named ``:parameters``,
``ON CONFLICT`` upserts, ``RETURNING id``) are described in :mod:`.schema`; the
schema's names are re-exported here so that ``sql.MIGRATIONS`` and
``sql.LATEST_VERSION`` keep working.
"""

from __future__ import annotations

from trainguard.model.fleet import ActionState
from trainguard.model.health import HealthState
from trainguard.model.records import AuditKind
from trainguard.store import rows
from trainguard.store.schema import (  # noqa: F401 - re-exported: one module for every caller
    INSERT_MIGRATION,
    LATEST_VERSION,
    MIGRATIONS,
    MIGRATIONS_TABLE,
    NO_LIMIT,
    POSTGRES_TYPES,
    SELECT_SCHEMA_VERSION,
    SQLITE_TYPES,
    Migration,
    render,
)


def _listed(columns: tuple[str, ...], **aliases: str) -> str:
    """A SELECT list of ``columns`` (declared in :mod:`.rows`); ``aliases`` maps a
    column name to the expression selected as it."""
    return ", ".join(f"{aliases[c]} AS {c}" if c in aliases else c for c in columns)


# --- jobs ----------------------------------------------------------------------------

JOB_COLUMNS = _listed(rows.JOB)
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

ATTEMPT_COLUMNS = _listed(rows.ATTEMPT)
INSERT_ATTEMPT = (
    f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES (:job_id, :number, :devices, :state,"
    " :started_at, NULL, NULL, NULL, :checkpoint_path, :checkpoint_step, NULL, NULL, NULL, NULL,"
    " :log_path, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
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
# A step with the job's own time (decision 0320): the first and the highest such step of
# one rank (the first that stamped one: ranks on other hosts have other clocks).
# Every right-hand side reads the row as it was before the update.
UPDATE_ATTEMPT_JOB_TIME = (
    "UPDATE attempts SET"
    " job_time_rank = COALESCE(job_time_rank, :rank),"
    " job_first_step = COALESCE(job_first_step, :step),"
    " job_first_time = COALESCE(job_first_time, :time),"
    " job_last_step = CASE WHEN job_last_step IS NULL OR job_last_step < :step"
    " THEN :step ELSE job_last_step END,"
    " job_last_time = CASE WHEN job_last_step IS NULL OR job_last_step < :step"
    " THEN :time ELSE job_last_time END"
    " WHERE job_id = :job_id AND number = :number"
    " AND (job_time_rank IS NULL OR job_time_rank = :rank)"
)
# The ranks' reports (decision 0406): a row per (attempt, rank), written by upsert.
RANK_COLUMNS = _listed(rows.RANK)
SELECT_ATTEMPT_EXISTS = "SELECT 1 FROM attempts WHERE job_id = :job_id AND number = :number"
SELECT_ATTEMPT_RANKS = (
    f"SELECT {RANK_COLUMNS} FROM attempt_ranks WHERE job_id = :job_id AND attempt = :number"
    " ORDER BY rank"
)
SELECT_JOB_RANKS = (
    f"SELECT {RANK_COLUMNS} FROM attempt_ranks WHERE job_id = :job_id ORDER BY attempt, rank"
)
UPSERT_ATTEMPT_RANK = (
    "INSERT INTO attempt_ranks (job_id, attempt, rank, host, local_rank, visible)"
    " VALUES (:job_id, :number, :rank, :host, :local_rank, :visible)"
    " ON CONFLICT (job_id, attempt, rank) DO UPDATE SET host = excluded.host,"
    " local_rank = excluded.local_rank, visible = excluded.visible"
)
INSERT_ATTEMPT_RANK_IF_NEW = (
    "INSERT INTO attempt_ranks (job_id, attempt, rank, host, local_rank, visible)"
    " VALUES (:job_id, :number, :rank, NULL, NULL, '[]')"
    " ON CONFLICT (job_id, attempt, rank) DO NOTHING"
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
# A job's own word on what it restored (its first ``resumed`` event) is taken once per
# attempt (decision 0405): a later event changes nothing.
UPDATE_ATTEMPT_RESUMED = (
    "UPDATE attempts SET checkpoint_path = :checkpoint_path, checkpoint_step = :checkpoint_step,"
    " resumed_at = :at WHERE job_id = :job_id AND number = :number AND resumed_at IS NULL"
)
# A ``resumed`` event that names no checkpoint (a fresh start) takes the one record too,
# and leaves what trainguard offered in place.
UPDATE_ATTEMPT_RESUMED_MARK = (
    "UPDATE attempts SET resumed_at = :at"
    " WHERE job_id = :job_id AND number = :number AND resumed_at IS NULL"
)
# Whether the job reports its own steps is a fact of the store, not of the process that
# took the report: in serve the API takes it and the loop child reads the output (0397).
UPDATE_ATTEMPT_SELF_REPORTED = (
    "UPDATE attempts SET self_reported_at = :at"
    " WHERE job_id = :job_id AND number = :number AND self_reported_at IS NULL"
)
SELECT_ATTEMPT_SELF_REPORTED = (
    "SELECT self_reported_at FROM attempts WHERE job_id = :job_id AND number = :number"
)

# --- incidents -----------------------------------------------------------------------

INCIDENT_COLUMNS = _listed(rows.INCIDENT)
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
SELECT_INCIDENT_SUMMARY = "SELECT summary FROM incidents WHERE id = :id"
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
    " repair = :repair, reason = :reason, resumed_step = :resumed_step,"
    " warnings = :warnings"
    " WHERE id = :id"
)

# --- devices -------------------------------------------------------------------------

DEVICE_COLUMNS = _listed(rows.DEVICE)
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
    "UPDATE devices SET state = :state, reason = :reason, since = :at WHERE uuid = :key"
)

# --- health (devices and nodes: one transition, one history shape) -------------------

SELECT_DEVICE_HEALTH_STATE = "SELECT state FROM devices WHERE uuid = :key"
SELECT_NODE_HEALTH_STATE = "SELECT state FROM nodes WHERE name = :key"
UPDATE_NODE_STATE = (
    "UPDATE nodes SET state = :state, reason = :reason, since = :at WHERE name = :key"
)
_HISTORY_COLUMNS = "at, old_state, new_state, reason, actor, job_id, incident_id, audit_id"
_HISTORY_VALUES = (
    ":key, :at, :old_state, :new_state, :reason, :actor, :job_id, :incident_id, :audit_id"
)
INSERT_DEVICE_HEALTH = (
    f"INSERT INTO device_health (device_uuid, {_HISTORY_COLUMNS}) VALUES ({_HISTORY_VALUES})"
    " RETURNING id"
)
INSERT_NODE_HEALTH = (
    f"INSERT INTO node_health (node_name, {_HISTORY_COLUMNS}) VALUES ({_HISTORY_VALUES})"
    " RETURNING id"
)
_DEVICE_HISTORY = _listed(rows.HEALTH_CHANGE, subject="device_uuid")
_NODE_HISTORY = _listed(rows.HEALTH_CHANGE, subject="node_name")
SELECT_DEVICE_HEALTH = (
    f"SELECT {_DEVICE_HISTORY} FROM device_health WHERE device_uuid = :key ORDER BY id"
)
SELECT_NODE_HEALTH = f"SELECT {_NODE_HISTORY} FROM node_health WHERE node_name = :key ORDER BY id"
SELECT_DEVICE_HEALTH_BY_INCIDENT = (
    f"SELECT {_DEVICE_HISTORY} FROM device_health WHERE incident_id = :incident_id ORDER BY id"
)
_SCHEDULABLE = ", ".join(f"'{s.value}'" for s in HealthState if s.schedulable)
SELECT_UNSCHEDULABLE_DEVICES = (
    f"SELECT uuid FROM devices WHERE state NOT IN ({_SCHEDULABLE}) ORDER BY uuid"
)
SELECT_UNSCHEDULABLE_NODES = (
    f"SELECT name FROM nodes WHERE state NOT IN ({_SCHEDULABLE}) ORDER BY name"
)
# The incremental health sync (decision 0122): whose health changed between two audit ids.
SELECT_HEALTH_SUBJECTS = (
    "SELECT subject FROM audit WHERE id > :after AND id <= :upto"
    f" AND kind = '{AuditKind.HEALTH.value}' ORDER BY id"
)

# --- audit ---------------------------------------------------------------------------

AUDIT_COLUMNS = _listed(rows.AUDIT)
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
SELECT_LAST_AUDIT_ID = "SELECT MAX(id) FROM audit"

# --- control plane (migration 2; the FleetStore's modules) ---------------------------

LEASE_COLUMNS = _listed(rows.LEASE)
SELECT_LEASE = f"SELECT {LEASE_COLUMNS} FROM leases WHERE name = :name"
INSERT_LEASE = (
    "INSERT INTO leases (name, holder, token, expires_at, acquired_at, renewed_at)"
    " VALUES (:name, :holder, :token, :expires_at, :at, :at)"
)
# Conditional on the token read in the same transaction: a lost race changes no row.
TAKE_LEASE = (
    "UPDATE leases SET holder = :holder, token = :token, expires_at = :expires_at,"
    " acquired_at = :at, renewed_at = :at WHERE name = :name AND token = :old_token"
)
RENEW_LEASE = (
    "UPDATE leases SET expires_at = :expires_at, renewed_at = :at"
    " WHERE name = :name AND holder = :holder AND token = :token"
)

NODE_COLUMNS = _listed(rows.NODE)
SELECT_NODE = f"SELECT {NODE_COLUMNS} FROM nodes WHERE name = :name"
SELECT_NODES = (
    f"SELECT {NODE_COLUMNS} FROM nodes WHERE (:partition_name IS NULL"
    " OR partition_name = :partition_name) ORDER BY name"
)
INSERT_NODE = (
    f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES (:name, :partition_name, :state, :reason,"
    " :at, :at, :at, :labels)"
)
UPDATE_NODE_SEEN = (
    "UPDATE nodes SET partition_name = COALESCE(:partition_name, partition_name),"
    " labels = :labels, last_seen = :at WHERE name = :name"
)

FLEET_JOB_COLUMNS = _listed(rows.FLEET_JOB)
INSERT_FLEET_JOB = (
    f"INSERT INTO fleet_jobs ({FLEET_JOB_COLUMNS}) VALUES (:job_id, :scheduler_ref,"
    " :partition_name, :policy, :opted_in, :registered_at)"
)
SELECT_FLEET_JOB = f"SELECT {FLEET_JOB_COLUMNS} FROM fleet_jobs WHERE job_id = :job_id"
SELECT_FLEET_JOB_BY_REF = (
    f"SELECT {FLEET_JOB_COLUMNS} FROM fleet_jobs WHERE scheduler_ref = :scheduler_ref"
)
SELECT_FLEET_JOBS = f"SELECT {FLEET_JOB_COLUMNS} FROM fleet_jobs ORDER BY registered_at, job_id"
UPDATE_FLEET_JOB = (
    "UPDATE fleet_jobs SET partition_name = :partition_name, policy = :policy,"
    " opted_in = :opted_in WHERE job_id = :job_id"
)

UPSERT_POLICY = (
    "INSERT INTO policies (name, document, updated_at, updated_by)"
    " VALUES (:name, :document, :at, :actor)"
    " ON CONFLICT (name) DO UPDATE SET document = excluded.document,"
    " updated_at = excluded.updated_at, updated_by = excluded.updated_by"
)
SELECT_POLICY = f"SELECT {_listed(rows.POLICY)} FROM policies WHERE name = :name"
SELECT_POLICIES = f"SELECT {_listed(rows.POLICY)} FROM policies ORDER BY name"
DELETE_POLICY = "DELETE FROM policies WHERE name = :name"

UPSERT_SCOPE_MODE = (
    "INSERT INTO scope_modes (scope, mode, set_by, set_at, reason)"
    " VALUES (:scope, :mode, :actor, :at, :reason)"
    " ON CONFLICT (scope) DO UPDATE SET mode = excluded.mode, set_by = excluded.set_by,"
    " set_at = excluded.set_at, reason = excluded.reason"
)
SELECT_SCOPE_MODES = f"SELECT {_listed(rows.SCOPE_MODE)} FROM scope_modes ORDER BY scope"
DELETE_SCOPE_MODE = "DELETE FROM scope_modes WHERE scope = :scope"

FINDING_COLUMNS = _listed(rows.FINDING)
INSERT_FINDING = (
    "INSERT INTO findings (at, received_at, host, job_id, attempt, kind, domain, device_uuid,"
    " data) VALUES (:at, :received_at, :host, :job_id, :attempt, :kind, :domain, :device_uuid,"
    " :data) RETURNING id"
)
SELECT_FINDINGS = (
    f"SELECT {FINDING_COLUMNS} FROM findings WHERE at >= :since AND at <= :until"
    " AND (:host IS NULL OR host = :host) AND (:job_id IS NULL OR job_id = :job_id)"
    " ORDER BY at, id"
)
SELECT_FINDINGS_AFTER = (
    f"SELECT {FINDING_COLUMNS} FROM findings WHERE id > :after_id ORDER BY id LIMIT :limit"
)

ACTION_COLUMNS = _listed(rows.ACTION)
INSERT_ACTION = (
    f"INSERT INTO actions ({ACTION_COLUMNS}) VALUES (:action_key, :incident_id, :generation,"
    " :idx, :type, :state, :fencing_token, :data, NULL, :at, NULL, :intent_audit_id, NULL)"
)
SELECT_ACTION = f"SELECT {ACTION_COLUMNS} FROM actions WHERE action_key = :action_key"
SELECT_ACTIONS = (
    f"SELECT {ACTION_COLUMNS} FROM actions WHERE (:incident_id IS NULL"
    " OR incident_id = :incident_id) ORDER BY incident_id, generation, idx"
)
# Only an intended action can finish, and only once.
FINISH_ACTION = (
    "UPDATE actions SET state = :state, result = :result, finished_at = :at,"
    " result_audit_id = :result_audit_id WHERE action_key = :action_key AND state = 'intended'"
)
SELECT_INTENDED_ACTIONS = (
    f"SELECT {ACTION_COLUMNS} FROM actions WHERE state = '{ActionState.INTENDED.value}'"
    " ORDER BY incident_id, generation, idx"
)

POWER_ACTION_COLUMNS = _listed(rows.POWER_ACTION)
INSERT_POWER_ACTION = (
    f"INSERT INTO power_actions ({POWER_ACTION_COLUMNS}) VALUES (:action_key, :node, :action,"
    " 'intended', :fencing_token, '[]', NULL, :at, :at, NULL)"
)
SELECT_POWER_ACTION = (
    f"SELECT {POWER_ACTION_COLUMNS} FROM power_actions WHERE action_key = :action_key"
)
SELECT_POWER_ACTIONS = (
    f"SELECT {POWER_ACTION_COLUMNS} FROM power_actions WHERE (:node IS NULL OR node = :node)"
    " AND (:state IS NULL OR state = :state) ORDER BY intended_at, action_key"
)
# Requests are recorded only while the action is unfinished: a finished action is final.
UPDATE_POWER_REQUESTS = (
    "UPDATE power_actions SET requests = :requests, fencing_token = :fencing_token,"
    " updated_at = :at WHERE action_key = :action_key AND state = 'intended'"
)
FINISH_POWER_ACTION = (
    "UPDATE power_actions SET state = 'done', result = :result, finished_at = :at,"
    " updated_at = :at, fencing_token = :fencing_token"
    " WHERE action_key = :action_key AND state = 'intended'"
)

APPROVAL_COLUMNS = _listed(rows.APPROVAL)
INSERT_APPROVAL = (
    "INSERT INTO approvals (kind, subject, why, state, incident_id, action_key, requested_at,"
    " requested_by, data) VALUES (:kind, :subject, :why, 'pending', :incident_id, :action_key,"
    " :at, :actor, :data) RETURNING id"
)
SELECT_APPROVAL = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = :id"
SELECT_APPROVAL_BY_KEY = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE action_key = :action_key"
SELECT_APPROVALS = (
    f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE (:state IS NULL OR state = :state)"
    " AND (:incident_id IS NULL OR incident_id = :incident_id) ORDER BY id"
)
DECIDE_APPROVAL = (
    "UPDATE approvals SET state = :state, decided_at = :at, decided_by = :actor,"
    " decision_reason = :reason WHERE id = :id AND state = 'pending'"
)

SELECT_BREAKER = f"SELECT {_listed(rows.BREAKER)} FROM breakers WHERE name = :name"
UPSERT_BREAKER = (
    "INSERT INTO breakers (name, state, changed_at, changed_by, reason, suppressed)"
    " VALUES (:name, :state, :at, :actor, :reason, 0)"
    " ON CONFLICT (name) DO UPDATE SET state = excluded.state, changed_at = excluded.changed_at,"
    " changed_by = excluded.changed_by, reason = excluded.reason, suppressed = 0"
)
COUNT_SUPPRESSED = "UPDATE breakers SET suppressed = suppressed + 1 WHERE name = :name"
INSERT_SUPPRESSION = (
    "INSERT INTO suppressions (at, breaker, resource_kind, resource_id, reason, incident_id)"
    " VALUES (:at, :breaker, :resource_kind, :resource_id, :reason, :incident_id) RETURNING id"
)
SELECT_SUPPRESSIONS = (
    f"SELECT {_listed(rows.SUPPRESSION)} FROM suppressions"
    " WHERE (:since IS NULL OR at >= :since) ORDER BY id"
)
INSERT_QUARANTINE = (
    "INSERT INTO quarantines (at, resource_kind, resource_id, incident_id)"
    " VALUES (:at, :resource_kind, :resource_id, :incident_id) RETURNING id"
)
COUNT_QUARANTINED_SINCE = (
    "SELECT COUNT(DISTINCT resource_id) FROM quarantines"
    " WHERE resource_kind = :resource_kind AND at >= :since"
)

REPAIR_COLUMNS = _listed(rows.REPAIR)
INSERT_REPAIR = (
    "INSERT INTO repairs (resource_kind, resource_id, host, incident_id, state, what_failed,"
    " recommended, evidence, created_at, updated_at, validations) VALUES (:resource_kind,"
    " :resource_id, :host, :incident_id, 'open', :what_failed, :recommended, :evidence, :at,"
    " :at, :validations) RETURNING id"
)
SELECT_REPAIR = f"SELECT {REPAIR_COLUMNS} FROM repairs WHERE id = :id"
SELECT_REPAIRS = (
    f"SELECT {REPAIR_COLUMNS} FROM repairs WHERE (:state IS NULL OR state = :state)"
    " AND (:resource_kind IS NULL OR resource_kind = :resource_kind)"
    " AND (:resource_id IS NULL OR resource_id = :resource_id) ORDER BY id"
)
UPDATE_REPAIR = (
    "UPDATE repairs SET state = :state, updated_at = :updated_at, outcome = :outcome,"
    " closed_at = :closed_at, closed_by = :closed_by, validations = :validations,"
    " evidence = :evidence WHERE id = :id"
)

DELIVERY_COLUMNS = _listed(rows.DELIVERY)
INSERT_DELIVERY = (
    "INSERT INTO deliveries (url, event, payload, created_at, attempts, next_attempt_at)"
    " VALUES (:url, :event, :payload, :at, 0, :at) RETURNING id"
)
SELECT_DELIVERY = f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = :id"
SELECT_DUE_DELIVERIES = (
    f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE delivered_at IS NULL"
    " AND next_attempt_at <= :now ORDER BY id LIMIT :limit"
)
SELECT_DELIVERIES = (
    f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE (:event IS NULL OR event = :event)"
    " ORDER BY id"
)
UPDATE_DELIVERY = (
    "UPDATE deliveries SET attempts = :attempts, next_attempt_at = :next_attempt_at,"
    " delivered_at = :delivered_at, last_error = :last_error, status_code = :status_code"
    " WHERE id = :id AND delivered_at IS NULL"
)

# Job progress tokens (decision 0403): only the SHA-256 of a token is stored; a token
# counts while its job is not over (a job not registered yet counts: submit issues the
# token before the scheduler starts the job).
INSERT_JOB_TOKEN = (
    "INSERT INTO job_tokens (token_hash, job_id, created_at, created_by)"
    " VALUES (:token_hash, :job_id, :at, :actor)"
)
DELETE_JOB_TOKEN = "DELETE FROM job_tokens WHERE token_hash = :token_hash"
SELECT_LIVE_JOB_TOKENS = (
    "SELECT t.token_hash, t.job_id FROM job_tokens t LEFT JOIN jobs j ON j.id = t.job_id"
    " WHERE j.id IS NULL OR j.state NOT IN ('completed', 'stopped')"
)
