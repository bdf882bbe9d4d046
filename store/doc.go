// Package store is the PostgreSQL side of the service's data access: the
// source of truth (users, dialogs, messages with per-dialog seq,
// idempotency records, the outbox, projects, attachments, internal inbox
// receipts) through a pgx pool, the attachment blob store (BlobStore,
// LocalBlobs), the idempotency scripts' data access, the project rows
// (members, settings, the legacy deadline) whose Redis mirror the project
// Redis API keeps, the embedded SQL migrations, and the mapping of
// PostgreSQL errors (Kind, IsPGUnavailable). The blob store's own failures
// (ErrBlobStoreFull, ErrBlobStoreUnavailable) are never taken for a
// PostgreSQL outage. The Redis plumbing it builds on
// (clients, health, locks, ACL, Redis error sentinels) is the subpackage
// store/rds; the project Redis API's own data (cache, topics, budgets) is
// store/project. Neither links a PostgreSQL driver.
//
// The realtime subscribe's check (DialogLastSeq: membership and the
// dialog's last seq) batches concurrent calls into one query over arrays of
// (dialog, user) pairs (realtime_batch.go).
//
// Outbox rows the request path published are marked delivered in batches
// by an OutboxMarker (one UPDATE per batch, off the request path), and
// delivered rows past their retention are deleted by an OutboxPurger; the
// relay's own claim-publish-mark transaction is RelayOutbox.
//
// Callers never see a transaction: every write that must commit together
// (a message with its seq, outbox event, idempotency record and safety
// task) is composed here from store operations.
//
// Every transaction of a request path runs through one helper
// (Store.requestTx): the pool wait is bounded by the request budget
// (SetRequestTimeout, HAN_DB_REQUEST_TIMEOUT), and lock_timeout and
// statement_timeout are set to it for that transaction only (SET LOCAL in
// the BEGIN round trip, never a session setting); overruns come back as
// ErrDatabaseBusy. Single statements of request paths (reqQueryRow,
// reqQuery, reqExec) wait for a pool connection at most the same budget.
// The message send is the exception that keeps the same budget another
// way: its transaction is one statement, the send_groups function, which
// sets lock_timeout for its own transaction (set_config, local), so the
// dialogs' row locks are never held across a client round trip; concurrent
// sends into one dialog are combined into one batch (send.go, sendqueue.go),
// and the batches of different dialogs that wait for a send transaction are
// written together by one such statement (sendgroup.go).
// Background jobs and migrations keep their own budgets, and no background
// job waits on PostgreSQL without a deadline: the relay's transaction
// (RelayOutbox), each purge statement and run (OutboxPurger) and each
// janitor run (Janitor) are cut when a connection goes silent, so the job
// goes on with a new connection instead of waiting until the kernel gives
// the silent one up.
//
// Nothing relies on session state between transactions, so the pool may sit
// behind PgBouncer in transaction pooling mode: no session SET (only SET
// LOCAL), no temporary tables, no LISTEN/NOTIFY, and the one advisory lock,
// the migration lock, is transaction-scoped (pg_advisory_xact_lock). How
// pgx sends statements is PGConfig.ExecMode (HAN_DB_EXEC_MODE,
// ParseExecMode): cache_statement, pgx's default, prepares named statements
// that a transaction pooler does not carry from one server connection to
// the next, so behind one the service runs with exec or simple_protocol
// (docs/runbook-postgres.md).
// Writes that change PostgreSQL and a Redis mirror (project settings, the
// legacy deadline) write the mirror inside the open transaction and commit
// only after it succeeded.
//
// Store and the clients are safe for concurrent use.
//
// Migrations (migrations/NNNN_name.sql, applied by Migrate) run in file-name
// order, each once, and are recorded by name in schema_migrations. The
// migrator keeps no checksum; an applied file's statements are never
// edited (every database that applied it would no longer match the
// repository), only its comments may be, which change nothing applied.
//
// A binary needs every migration built into it: the gateway asks
// MissingMigrations (one query) at start and refuses to run on a database
// that lacks one. Versions recorded that the binary does not know are
// accepted, because a migration is written so that the binary of the
// release before it still runs on the schema it leaves: during a rolling
// deploy the new binary's migrations run first and old instances go on
// serving (or restart) on the newer schema. A migration therefore never
// drops, renames or changes the arguments or results of anything the
// previous release's binary uses; that waits a release.
//
// Numbers 0003 and 0004 do not exist and never did: no file with those
// numbers was ever committed (git log -- store/migrations shows 0001, 0002,
// then 0005), the numbers were skipped when 0005 was added. The gap is
// harmless, since only the order matters. A new migration takes the next
// number above the highest, never a free one below it: a database that has
// applied 0005 would run a new 0003 after it while a fresh one runs it
// before, and the two schemas could differ.
package store
