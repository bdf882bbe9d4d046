package soak

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	prj "github.com/han-app/gateway/store/project"
)

// BodyPrefix starts every message body the soak sends; the Idempotency-Key
// follows, so a row names the send it came from.
const BodyPrefix = "soak:"

// Violation is one broken invariant.
type Violation struct {
	Invariant string    `json:"invariant"`
	Detail    string    `json:"detail"`
	At        time.Time `json:"at"`
}

// Invariant names.
const (
	InvDuplicateRow     = "duplicate_row"         // an Idempotency-Key has more than one row
	InvLostMessage      = "lost_message"          // a 201 without its row
	InvWrongRow         = "wrong_row"             // a 201 whose row has another id or dialog
	InvSeqGap           = "seq_gap"               // a dialog's seqs are not 1..last_seq
	InvNotDelivered     = "not_delivered"         // a member's client lacks a committed message after reconciling
	InvPhantom          = "phantom_delivery"      // a client holds a seq/id PostgreSQL does not have
	InvQueueRedelivered = "queue_redelivered"     // a queue message claimed again after its ack
	InvQueueLost        = "queue_lost"            // a published queue message never acked
	InvBudgetNegative   = "budget_negative"       // a budget counter below zero
	InvBudgetFloor      = "budget_not_at_floor"   // budgets not back to the unexpired dedupe bytes when drained
	InvNoTTL            = "key_without_ttl"       // an application key of a family that must expire has no TTL
	InvResourceGrowth   = "resource_growth"       // gateway RSS, goroutines or descriptors still growing
	InvRecovery         = "recovery_over_bound"   // a fault's recovery took longer than the bound
	InvNoRecovery       = "recovery_not_observed" // no successful send or resubscription after a fault
)

// SendRecord is what a chat sender knows about one Idempotency-Key.
type SendRecord struct {
	Key       string
	DialogID  string
	Confirmed bool // a 201 was received
	MessageID string
	Seq       int64
}

// Row is one message row of PostgreSQL.
type Row struct {
	ID   string
	Seq  int64
	Body string
}

// ClientView is what one member's client holds after reconciling: per
// dialog, seq → message id.
type ClientView struct {
	UserID  string
	Dialogs map[string]map[int64]string
}

// Checker reads the stores to check the invariants. Safe for concurrent use.
type Checker struct {
	DB     *pgxpool.Pool
	Redis0 *redis.Client // unrestricted, DB0
	Redis1 *redis.Client // unrestricted, DB1
	// Env and ProjectID name the project whose budget is checked ("" skips).
	Env, ProjectID string
}

// Messages checks the message rows of dialogs against the senders'
// records: every 201 has exactly one row (its id), every key at most one,
// and every dialog's seqs run 1..last_seq without a gap. It returns the
// rows by dialog for CheckClients.
func (c *Checker) Messages(ctx context.Context, dialogs []string, sends []SendRecord) (map[string][]Row, []Violation, error) {
	now := time.Now()
	rows := map[string][]Row{}
	var vs []Violation
	// One snapshot for the rows and last_seq: sends commit meanwhile.
	tx, err := c.DB.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := tx.Query(ctx, `SELECT dialog_id::text, id::text, seq, body FROM messages WHERE dialog_id = ANY($1::uuid[]) ORDER BY dialog_id, seq`, dialogs)
	if err != nil {
		return nil, nil, err
	}
	byKey := map[string][]Row{}
	for res.Next() {
		var d string
		var r Row
		if err := res.Scan(&d, &r.ID, &r.Seq, &r.Body); err != nil {
			res.Close()
			return nil, nil, err
		}
		rows[d] = append(rows[d], r)
		if k, ok := strings.CutPrefix(r.Body, BodyPrefix); ok {
			byKey[k] = append(byKey[k], r)
		}
	}
	res.Close()
	if err := res.Err(); err != nil {
		return nil, nil, err
	}
	last := map[string]int64{}
	lres, err := tx.Query(ctx, `SELECT id::text, last_seq FROM dialogs WHERE id = ANY($1::uuid[])`, dialogs)
	if err != nil {
		return nil, nil, err
	}
	for lres.Next() {
		var d string
		var n int64
		if err := lres.Scan(&d, &n); err != nil {
			lres.Close()
			return nil, nil, err
		}
		last[d] = n
	}
	lres.Close()
	if err := lres.Err(); err != nil {
		return nil, nil, err
	}
	for _, d := range dialogs {
		rs := rows[d]
		for i, r := range rs {
			if r.Seq != int64(i+1) {
				vs = append(vs, Violation{InvSeqGap, fmt.Sprintf("dialog %s: row %d has seq %d (want %d)", d, i+1, r.Seq, i+1), now})
				break
			}
		}
		if int64(len(rs)) != last[d] {
			vs = append(vs, Violation{InvSeqGap, fmt.Sprintf("dialog %s: %d rows, last_seq %d", d, len(rs), last[d]), now})
		}
	}
	for _, s := range sends {
		got := byKey[s.Key]
		switch {
		case len(got) > 1:
			vs = append(vs, Violation{InvDuplicateRow, fmt.Sprintf("key %s: %d rows", s.Key, len(got)), now})
		case s.Confirmed && len(got) == 0:
			vs = append(vs, Violation{InvLostMessage, fmt.Sprintf("key %s: 201 (message %s) without a row", s.Key, s.MessageID), now})
		case s.Confirmed && (got[0].ID != s.MessageID || got[0].Seq != s.Seq):
			vs = append(vs, Violation{InvWrongRow, fmt.Sprintf("key %s: 201 said %s seq %d, row is %s seq %d", s.Key, s.MessageID, s.Seq, got[0].ID, got[0].Seq), now})
		}
	}
	return rows, vs, nil
}

// CheckClients compares every member's reconciled view with the rows:
// each committed message exactly once (same seq and id), nothing else.
// members maps a dialog to the user ids whose clients must hold it.
func CheckClients(rows map[string][]Row, members map[string][]string, views []ClientView) []Violation {
	now := time.Now()
	byUser := map[string]ClientView{}
	for _, v := range views {
		byUser[v.UserID] = v
	}
	var vs []Violation
	dialogs := make([]string, 0, len(members))
	for d := range members {
		dialogs = append(dialogs, d)
	}
	sort.Strings(dialogs)
	for _, d := range dialogs {
		want := map[int64]string{}
		for _, r := range rows[d] {
			want[r.Seq] = r.ID
		}
		for _, u := range members[d] {
			have := byUser[u].Dialogs[d]
			missing := 0
			for seq, id := range want {
				if have[seq] != id {
					missing++
				}
			}
			if missing > 0 {
				vs = append(vs, Violation{InvNotDelivered, fmt.Sprintf("dialog %s, user %s: %d of %d messages missing or different", d, u, missing, len(want)), now})
			}
			for seq, id := range have {
				if w, ok := want[seq]; !ok || w != id {
					vs = append(vs, Violation{InvPhantom, fmt.Sprintf("dialog %s, user %s: seq %d id %s not in PostgreSQL", d, u, seq, id), now})
					break
				}
			}
		}
	}
	return vs
}

// Budgets checks that no budget counter (the module's and the project's)
// is negative.
func (c *Checker) Budgets(ctx context.Context) ([]Violation, map[string]int64, error) {
	now := time.Now()
	var vs []Violation
	keys := []string{prj.NewModuleKeys(c.Env).Budget()}
	if c.ProjectID != "" {
		keys = append(keys, prj.NewKeys(c.Env, c.ProjectID).Budget())
	}
	project := map[string]int64{}
	for i, k := range keys {
		h, err := c.Redis0.HGetAll(ctx, k).Result()
		if err != nil {
			return nil, nil, err
		}
		for f, v := range h {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue // window bookkeeping fields that are not counters
			}
			if n < 0 {
				vs = append(vs, Violation{InvBudgetNegative, fmt.Sprintf("%s %s = %d", k, f, n), now})
			}
			if i == 1 {
				project[f] = n
			}
		}
	}
	return vs, project, nil
}

// BudgetFloor checks a drained, trimmed project: message and receipt bytes
// are zero and the dedupe bytes are those of the unexpired dedupe records,
// between minDedupe (confirmed publishes) and maxDedupe (plus the ones
// whose answer was lost).
func BudgetFloor(project map[string]int64, minDedupe, maxDedupe int64) []Violation {
	now := time.Now()
	var vs []Violation
	for f, n := range project {
		if (f == "msg" || f == "rcpt" || strings.HasPrefix(f, "tb:")) && n != 0 {
			vs = append(vs, Violation{InvBudgetFloor, fmt.Sprintf("%s = %d after the queue drained (want 0)", f, n), now})
		}
	}
	if dd := project["dd"]; dd < minDedupe || dd > maxDedupe {
		vs = append(vs, Violation{InvBudgetFloor, fmt.Sprintf("dd = %d, want the unexpired dedupe records' %d..%d", dd, minDedupe, maxDedupe), now})
	}
	return vs
}

// DedupeRecordBytes is what one dedupe record holds of the project budget:
// its identity (topic id + producerId + clientEventId + 2) twice, plus 320.
func DedupeRecordBytes(topicID, producerID, clientEventID string) int64 {
	return 2*int64(len(topicID)+len(producerID)+len(clientEventID)+2) + 320
}

// TTLFamilies are the key families whose every key carries a TTL (the key
// layout of docs/redis-keys.md).
var TTLFamilies = []string{"han:api:*", "han:rt:*", "han:coord:*", "han:settings:*"}

// TTLs reports every key of TTLFamilies, in DB0 and DB1, without a TTL.
func (c *Checker) TTLs(ctx context.Context) ([]Violation, error) {
	now := time.Now()
	var vs []Violation
	for db, cl := range []*redis.Client{c.Redis0, c.Redis1} {
		for _, p := range TTLFamilies {
			it := cl.Scan(ctx, 0, p, 500).Iterator()
			for it.Next(ctx) {
				ttl, err := cl.PTTL(ctx, it.Val()).Result()
				if err != nil {
					return nil, err
				}
				if ttl == -1 {
					vs = append(vs, Violation{InvNoTTL, fmt.Sprintf("db%d %s", db, it.Val()), now})
				}
			}
			if err := it.Err(); err != nil {
				return nil, err
			}
		}
	}
	return vs, nil
}
