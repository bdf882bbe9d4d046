package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// ErrIdemExists is returned by InsertIdempotencyTx when a live (unexpired)
// record already holds the key: the business transaction must roll back and
// the request be answered from that record.
var ErrIdemExists = errors.New("store: idempotency record exists")

// IdemKey identifies one idempotency key of one user for one operation.
// KeyHMAC is the hex HMAC of the client's Idempotency-Key, never the key.
type IdemKey struct {
	Scope   string // operation, e.g. "msg_send"; no braces
	UserID  string
	KeyHMAC string
}

func (k IdemKey) tag() string { return "{" + k.Scope + ":" + k.UserID + ":" + k.KeyHMAC + "}" }

// RecordKey is han:api:idem:{<scope>:<user_id>:<key_hmac>}.
func (k IdemKey) RecordKey() string { return "han:api:idem:" + k.tag() }

// LockKey is han:api:idemlock:{<scope>:<user_id>:<key_hmac>}.
func (k IdemKey) LockKey() string { return "han:api:idemlock:" + k.tag() }

// GoneKey is han:api:idemgone:{<scope>:<user_id>:<key_hmac>}: the owner
// tokens whose reserve or takeover was given up without a reply (a SET
// that lives one lock TTL).
func (k IdemKey) GoneKey() string { return "han:api:idemgone:" + k.tag() }

// lockKeys are the keys of the scripts that complete, release or extend a
// lock; ownerKeys add GoneKey for those that take or give up one.
func (k IdemKey) lockKeys() []string  { return []string{k.RecordKey(), k.LockKey()} }
func (k IdemKey) ownerKeys() []string { return []string{k.RecordKey(), k.LockKey(), k.GoneKey()} }

// IdemRecord is a completed request as stored in Redis and PostgreSQL: no
// body, token, URL or personal data, only what rebuilds the response from
// the resource, so a stored response leaks nothing secret.
type IdemRecord struct {
	Fingerprint string
	Status      int
	ResourceID  string
	Version     int64
	// Meta is a small JSON object (e.g. an upload URL's expiry); "" or
	// "{}" when unused.
	Meta string
	// Expires is when the durable record expires, on this process's
	// monotonic clock; set by LookupIdempotency only. It is the lookup's
	// start plus the life PostgreSQL said the row had left, so it is never
	// later than the row's own expiry: a Redis record re-warmed from the
	// row lives time.Until(Expires), not a fresh RecordTTL.
	Expires time.Time
}

// IdemOutcome is the answer of a reservation.
type IdemOutcome int

// Reservation outcomes.
const (
	IdemAcquired   IdemOutcome = iota + 1 // the caller owns the lock and runs the request
	IdemReplay                            // completed with the same fingerprint: Record holds it
	IdemConflict                          // the key was used with another fingerprint
	IdemInProgress                        // another request holds the lock
)

// IdemReservation is the result of Idempotency.Reserve.
type IdemReservation struct {
	Outcome IdemOutcome
	Record  IdemRecord    // IdemReplay only (Fingerprint is the caller's)
	LockTTL time.Duration // IdemInProgress: what is left of the other owner's lock
	Holder  string        // IdemInProgress: the other owner's token
}

// IdempotencyConfig tunes Idempotency.
type IdempotencyConfig struct {
	// RecordTTL is how long a completed record lives in Redis and in
	// PostgreSQL (expires_at). Zero value means 24h.
	RecordTTL time.Duration
	// LockTTL is the lock's lifetime between heartbeats. Zero value means 30s.
	LockTTL time.Duration
	// Linger is how long a script call that finds the shared pipeline free
	// waits for other requests' calls to join it (0: sent at once).
	Linger time.Duration
	// OnAbandon, if set, is told how n abandoned owner tokens ended
	// (AbandonReleased, AbandonMarked, AbandonExpired, AbandonDropped).
	OnAbandon func(outcome string, n int)
}

// Idempotency is the data access of idempotency keys: the Lua scripts on DB0
// (reserve, complete, release, extend) and the durable records in
// PostgreSQL. Every Redis call goes through the RedisHealth (when given), so
// a dead DB0 fails at once; on a Redis Cluster a master found unreachable
// fails at once the calls on its keys, and only those. It is safe for
// concurrent use.
type Idempotency struct {
	rdb    *rds.Batcher // scripts of concurrent requests share pipelines
	health *rds.RedisHealth
	cfg    IdempotencyConfig
	ab     abandoner
}

// NewIdempotency builds the idempotency store on DB0. health may be nil.
func NewIdempotency(rdb redis.UniversalClient, health *rds.RedisHealth, cfg IdempotencyConfig) *Idempotency {
	if cfg.RecordTTL <= 0 {
		cfg.RecordTTL = 24 * time.Hour
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 30 * time.Second
	}
	b := rds.NewBatcher(rdb)
	b.SetLinger(cfg.Linger)
	i := &Idempotency{rdb: b, health: health, cfg: cfg}
	i.initAbandoner()
	return i
}

// Config returns the effective configuration.
func (i *Idempotency) Config() IdempotencyConfig { return i.cfg }

// Health returns the DB0 health state (may be nil).
func (i *Idempotency) Health() *rds.RedisHealth { return i.health }

// run sends one script call on keys (of k). When the call fails without a reply
// and owner is not empty, the owner token is abandoned (abandonLater): the
// call may still reach Redis and take or keep the lock for a request that
// no longer runs.
func (i *Idempotency) run(ctx context.Context, s *lua.Script, k IdemKey, keys []string, owner string, args ...any) (*redis.Cmd, error) {
	if err := i.health.CheckKey(k.RecordKey()); err != nil {
		return nil, err
	}
	cmd := i.rdb.Script(ctx, s, keys, args...)
	if err := cmd.Err(); err != nil {
		if owner != "" && rds.Unanswered(err) {
			i.abandonLater(k, owner)
		}
		return nil, i.health.ObserveKey(k.RecordKey(), err)
	}
	return cmd, nil
}

// Reserve runs the reserve/compare/lock script for fingerprint fp with the
// caller's random owner token. When Redis does not answer, the token is
// abandoned: if the call still runs there later, the lock it takes is given
// back as soon as Redis answers again.
func (i *Idempotency) Reserve(ctx context.Context, k IdemKey, fp, owner string) (IdemReservation, error) {
	cmd, err := i.run(ctx, lua.IdemReserve, k, k.ownerKeys(), owner, fp, owner, i.cfg.LockTTL.Milliseconds())
	if err != nil {
		return IdemReservation{}, fmt.Errorf("idempotency reserve: %w", err)
	}
	return reservation(cmd, fp, "idempotency reserve")
}

// ReserveWith is Reserve with first, an independent script call of the
// same request (its rate-limit decision), sent in the same round trip
// before the reserve; first's reply is returned as it came. When DB0 is
// known to be down neither is sent and first's reply carries that error.
func (i *Idempotency) ReserveWith(ctx context.Context, k IdemKey, fp, owner string, first rds.ScriptCall) (IdemReservation, *redis.Cmd, error) {
	if err := i.health.CheckKey(k.RecordKey()); err != nil {
		reply := redis.NewCmd(ctx)
		reply.SetErr(err)
		return IdemReservation{}, reply, fmt.Errorf("idempotency reserve: %w", err)
	}
	keys := k.ownerKeys()
	cmds := i.rdb.Scripts(ctx, first, rds.ScriptCall{Script: lua.IdemReserve, Keys: keys,
		Args: []any{fp, owner, i.cfg.LockTTL.Milliseconds()}})
	if err := cmds[1].Err(); err != nil {
		if rds.Unanswered(err) {
			i.abandonLater(k, owner)
		}
		return IdemReservation{}, cmds[0], fmt.Errorf("idempotency reserve: %w", i.health.ObserveKey(k.RecordKey(), err))
	}
	res, err := reservation(cmds[1], fp, "idempotency reserve")
	return res, cmds[0], err
}

// TakeOver hands the lock of an in-progress key to owner when it still holds
// seen, the token of an owner whose instance the caller found dead (the
// compare and the swap are one script, so of two callers that saw the same
// dead owner only one acquires). The reply is Reserve's: IdemAcquired, or the
// key's current state when it changed meanwhile.
func (i *Idempotency) TakeOver(ctx context.Context, k IdemKey, fp, seen, owner string) (IdemReservation, error) {
	cmd, err := i.run(ctx, lua.IdemTakeover, k, k.ownerKeys(), owner, fp, seen, owner, i.cfg.LockTTL.Milliseconds())
	if err != nil {
		return IdemReservation{}, fmt.Errorf("idempotency takeover: %w", err)
	}
	return reservation(cmd, fp, "idempotency takeover")
}

// reservation parses the reply shared by idem_reserve and idem_takeover.
func reservation(cmd *redis.Cmd, fp, op string) (IdemReservation, error) {
	v, err := cmd.Slice()
	if err != nil || len(v) == 0 {
		return IdemReservation{}, fmt.Errorf("%s: unexpected reply: %w", op, rds.ErrRedisUnavailable)
	}
	switch v[0] {
	case "acquired":
		return IdemReservation{Outcome: IdemAcquired}, nil
	case "conflict":
		return IdemReservation{Outcome: IdemConflict}, nil
	case "in_progress":
		ms, _ := v[1].(int64)
		var holder string
		if len(v) >= 4 {
			holder, _ = v[3].(string)
		}
		return IdemReservation{Outcome: IdemInProgress, LockTTL: time.Duration(ms) * time.Millisecond, Holder: holder}, nil
	case "replay":
		if len(v) >= 5 {
			st, _ := v[1].(int64)
			rid, _ := v[2].(string)
			ver, _ := v[3].(int64)
			meta, _ := v[4].(string)
			return IdemReservation{Outcome: IdemReplay, Record: IdemRecord{Fingerprint: fp, Status: int(st), ResourceID: rid, Version: ver, Meta: meta}}, nil
		}
	}
	return IdemReservation{}, fmt.Errorf("%s: unexpected reply: %w", op, rds.ErrRedisUnavailable)
}

// Complete stores rec as completed for ttl and releases the lock, only if
// owner still holds it. ttl is what is left of the durable record's life
// (RecordTTL at most), so the Redis record does not outlive it; a caller
// with less than a millisecond left releases the lock instead. It returns 1
// stored, 0 another owner holds the lock, -1 no lock (nothing is written
// unless 1).
func (i *Idempotency) Complete(ctx context.Context, k IdemKey, owner string, rec IdemRecord, ttl time.Duration) (int64, error) {
	cmd, err := i.run(ctx, lua.IdemComplete, k, k.lockKeys(), "", owner, rec.Fingerprint, rec.Status, rec.ResourceID, rec.Version, rec.Meta, ttl.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("idempotency complete: %w", err)
	}
	n, _ := cmd.Int64()
	return n, nil
}

// CompleteLater is Complete for a caller that does not wait: the call
// joins the next shared pipeline of such calls (rds.Batcher.ScriptLater).
// done, if not nil, gets Complete's error. Meanwhile the lock still says
// in progress, and a retry that meets it is answered from the PostgreSQL
// record the business transaction wrote.
func (i *Idempotency) CompleteLater(k IdemKey, owner string, rec IdemRecord, ttl time.Duration, done func(error)) {
	if err := i.health.CheckKey(k.RecordKey()); err != nil {
		if done != nil {
			done(fmt.Errorf("idempotency complete: %w", err))
		}
		return
	}
	args := []any{owner, rec.Fingerprint, rec.Status, rec.ResourceID, rec.Version, rec.Meta, ttl.Milliseconds()}
	i.rdb.ScriptLater(lua.IdemComplete, k.lockKeys(), args, func(cmd *redis.Cmd) {
		err := cmd.Err()
		if err != nil {
			err = fmt.Errorf("idempotency complete: %w", i.health.ObserveKey(k.RecordKey(), err))
		}
		if done != nil {
			done(err)
		}
	})
}

// Close stops giving up abandoned tokens (the locks those left expire with
// their TTL, or are taken over once this instance is gone), then sends the
// completes CompleteLater queued and waits for them.
func (i *Idempotency) Close() {
	i.abandonClose()
	i.rdb.Close()
}

// Release returns the key to absent (the request is not stored), only for
// owner: 1 released, 0 another owner, -1 no lock. A release that gets no
// reply abandons the token, which releases the lock once Redis answers.
func (i *Idempotency) Release(ctx context.Context, k IdemKey, owner string) (int64, error) {
	cmd, err := i.run(ctx, lua.IdemRelease, k, k.lockKeys(), owner, owner)
	if err != nil {
		return 0, fmt.Errorf("idempotency release: %w", err)
	}
	n, _ := cmd.Int64()
	return n, nil
}

// Extend is the owner's heartbeat: 1 extended, 0 another owner, -1 no lock.
func (i *Idempotency) Extend(ctx context.Context, k IdemKey, owner string) (int64, error) {
	cmd, err := i.run(ctx, lua.IdemExtend, k, k.lockKeys(), "", owner, i.cfg.LockTTL.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("idempotency extend: %w", err)
	}
	n, _ := cmd.Int64()
	return n, nil
}

// LookupIdempotency reads the durable record of k from PostgreSQL; expired rows are
// ignored (found is false). A request statement like any other: its wait
// for a connection and its run are bounded by the request budget, and
// running out of it is ErrDatabaseBusy (a keyed request that meets a lock
// held elsewhere, and every keyed send while Redis is out, read here).
//
// rec.Expires is the row's expiry on this process's clock: PostgreSQL
// computes the life left (expires_at - now(), its own clock, so the two
// hosts' clocks need not agree), counted from before the query was sent.
func (s *Store) LookupIdempotency(ctx context.Context, k IdemKey) (rec IdemRecord, found bool, err error) {
	start := time.Now()
	var leftMs int64
	err = s.reqQueryRow(ctx, `SELECT fingerprint, status, resource_id, version, meta::text,
			floor(extract(epoch FROM expires_at - now()) * 1000)::bigint
		FROM idempotency_records WHERE scope=$1 AND user_id=$2 AND key_hmac=$3 AND expires_at > now()`,
		k.Scope, k.UserID, k.KeyHMAC).Scan(&rec.Fingerprint, &rec.Status, &rec.ResourceID, &rec.Version, &rec.Meta, &leftMs)
	rec.Expires = start.Add(time.Duration(leftMs) * time.Millisecond)
	if errors.Is(err, pgx.ErrNoRows) {
		return IdemRecord{}, false, nil
	}
	if err != nil {
		return IdemRecord{}, false, fmt.Errorf("lookup idempotency record: %w", err)
	}
	return rec, true, nil
}

// IdemWrite is the durable idempotency record of a request, written in the
// same transaction as the effect it records, so the two commit or roll
// back together: Key and Fingerprint name the request, TTL is the record's
// lifetime, and Record derives its outcome (status, resource, version,
// meta) from the entity the transaction wrote. A live record with the same
// key makes the transaction fail with ErrIdemExists.
type IdemWrite[T any] struct {
	Key         IdemKey
	Fingerprint string
	TTL         time.Duration
	Record      func(T) IdemRecord
}

func (w *IdemWrite[T]) insert(ctx context.Context, tx pgx.Tx, v T) error {
	if w == nil {
		return nil
	}
	rec := w.Record(v)
	rec.Fingerprint = w.Fingerprint
	return InsertIdempotencyTx(ctx, tx, w.Key, rec, w.TTL)
}

// InsertIdempotencyTx writes the durable record inside the business
// transaction tx. An expired row with the same key is replaced; a live one
// makes it return ErrIdemExists (the unique key is the final guard against a
// second business effect when Redis lost its record).
func InsertIdempotencyTx(ctx context.Context, tx pgx.Tx, k IdemKey, rec IdemRecord, ttl time.Duration) error {
	meta := rec.Meta
	if meta == "" {
		meta = "{}"
	}
	tag, err := tx.Exec(ctx, `INSERT INTO idempotency_records
		(scope, user_id, key_hmac, fingerprint, status, resource_id, version, meta, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, now(), now() + $9 * interval '1 millisecond')
		ON CONFLICT (scope, user_id, key_hmac) DO UPDATE SET
			fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status, resource_id = EXCLUDED.resource_id,
			version = EXCLUDED.version, meta = EXCLUDED.meta, created_at = EXCLUDED.created_at,
			expires_at = EXCLUDED.expires_at
		WHERE idempotency_records.expires_at <= now()`,
		k.Scope, k.UserID, k.KeyHMAC, rec.Fingerprint, rec.Status, rec.ResourceID, rec.Version, meta, ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("insert idempotency record: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrIdemExists
	}
	return nil
}

// PurgeExpiredIdempotency deletes expired idempotency records in batches of
// at most batch rows (so no statement holds many row locks) and returns how
// many it removed.
func (s *Store) PurgeExpiredIdempotency(ctx context.Context, batch int) (int64, error) {
	var total int64
	for {
		// expires_at is checked again on the row deleted: a request that
		// reuses an expired key rewrites the row in place, and a DELETE
		// that waited for that row's lock must not take the live record.
		tag, err := s.pool.Exec(ctx, `DELETE FROM idempotency_records WHERE ctid = ANY(ARRAY(
			SELECT ctid FROM idempotency_records WHERE expires_at <= now() LIMIT $1)) AND expires_at <= now()`, batch)
		if err != nil {
			return total, fmt.Errorf("purge idempotency records: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
