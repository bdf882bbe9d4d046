package project

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/lua"
)

// Receipt is one subscription's state of one message. Status is pending
// (never claimed), leased, processed, failed or exhausted; LeaseUntil is 0
// unless leased; Result is nil unless processed or failed.
type Receipt struct {
	MessageID      string
	SubscriptionID string
	Status         string
	Attempts       int
	LeaseUntil     int64
	Result         *string
	UpdatedAt      int64
}

// ClaimItem is one lease: the message, its receipt, and the token that
// acknowledges it (shown once; only its hash is stored).
type ClaimItem struct {
	Message    TopicMessage
	Receipt    Receipt
	Token      string
	LeaseUntil int64
}

// receiptRecord is a receipt as stored (JSON in …:s:<sid>:r).
type receiptRecord struct {
	S string  `json:"s"`
	A int     `json:"a"`
	L int64   `json:"l"`
	U int64   `json:"u"`
	R *string `json:"r"`
}

// valid reports whether a stored receipt record is one: a JSON object
// whose status is one a receipt can have. A record without one (`{}`,
// `null`, another object) is unreadable, never a receipt shown with no
// status.
func (r receiptRecord) valid() bool {
	switch r.S {
	case "pending", "leased", "processed", "failed", "exhausted":
		return r.A >= 0
	}
	return false
}

// view is the receipt as the API shows it at nowMs: a receipt whose last
// allowed lease has expired is exhausted even before a claim or trim
// records it.
func (r receiptRecord) view(msgID, subID string, nowMs int64) Receipt {
	out := Receipt{MessageID: msgID, SubscriptionID: subID, Status: r.S, Attempts: r.A, UpdatedAt: r.U}
	switch r.S {
	case "leased":
		if r.L <= nowMs && r.A >= ReceiptMaxAttempts {
			out.Status, out.UpdatedAt = "exhausted", r.L
		} else {
			out.LeaseUntil = r.L
		}
	case "processed", "failed":
		res := ""
		if r.R != nil {
			res = *r.R
		}
		out.Result = &res
	}
	return out
}

// ListReceipts returns one page of a subscription's receipts (message
// order) and the next cursor ("" at the end). No token, not even its hash.
func (q *Queue) ListReceipts(ctx context.Context, k Keys, subID, cursor string, limit int) ([]Receipt, string, error) {
	after, err := ParseStreamCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	tid, err := q.topicOf(ctx, k, subID)
	if err != nil {
		return nil, "", err
	}
	res, err := lua.ProjectTopicReceipts.Run(ctx, q.rdb, []string{k.Subscriptions(), k.TopicStream(tid), k.Receipts(subID)},
		subID, tid, after, limit).Slice()
	if err != nil {
		return nil, "", classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
	case "subscription_not_found":
		return nil, "", ErrSubscriptionNotFound
	default:
		return nil, "", ErrDataStateInvalid
	}
	now := int64At(res, 1)
	flat, ok1 := res[2].([]any)
	more, ok2 := res[3].(int64)
	if !ok1 || !ok2 || len(flat)%2 != 0 {
		return nil, "", ErrDataStateInvalid
	}
	out := make([]Receipt, 0, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		id, _ := flat[i].(string)
		raw, _ := flat[i+1].(string)
		var rec receiptRecord
		if err := json.Unmarshal([]byte(raw), &rec); err != nil || !rec.valid() {
			return nil, "", ErrDataStateInvalid
		}
		out = append(out, rec.view(id, subID, now))
	}
	next := ""
	if more == 1 && len(out) > 0 {
		next = StreamCursor(out[len(out)-1].MessageID)
	}
	return out, next, nil
}

// newLeaseTokens returns n fresh random lease tokens (32 random bytes,
// base64url) and the hashes stored in their place (LeaseTokenHash),
// concatenated (n times 32 hex digits, as the claim script takes them),
// from one random read and two string allocations (a claim asks for up to
// ClaimCountMax at once, most of them unused when little is pending).
func newLeaseTokens(n int) (tokens []string, hashes string) {
	const rawLen, tokLen, hashLen = 32, 43, 32
	raw := make([]byte, n*rawLen)
	_, _ = rand.Read(raw)
	tb := make([]byte, n*tokLen)
	for i := range n {
		base64.RawURLEncoding.Encode(tb[i*tokLen:], raw[i*rawLen:(i+1)*rawLen])
	}
	all := string(tb)
	hb := make([]byte, n*hashLen)
	tokens = make([]string, n)
	for i := range n {
		tokens[i] = all[i*tokLen : (i+1)*tokLen]
		sum := sha256.Sum256(tb[i*tokLen : (i+1)*tokLen])
		hex.Encode(hb[i*hashLen:], sum[:hashLen/2])
	}
	return tokens, string(hb)
}

// LeaseTokenHash is the stored form of a lease token: 128 bits of its
// SHA-256, hex.
func LeaseTokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:16])
}

// Claim leases up to count messages of a subscription. projectPaused is
// the project's deliveryPaused (PostgreSQL). Errors:
// ErrSubscriptionNotFound, ErrDeliveryPaused, ErrSubscriptionPaused.
func (q *Queue) Claim(ctx context.Context, k Keys, subID string, count int, projectPaused bool) ([]ClaimItem, error) {
	sk, err := q.subKeysOf(ctx, k, subID)
	if err != nil {
		return nil, err
	}
	tid := sk.tid
	tokens, hashes := q.tokens.take(count)
	res, err := q.merge(newMergeCall(ctx, lua.ProjectTopicClaim, false, sk.claim,
		[]any{subID, tid, q.cfg.Lease.Milliseconds(), ReceiptMaxAttempts, b01(projectPaused), claimExpiredScan}, count, hashes))
	if err != nil {
		return nil, classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
	case "subscription_not_found":
		q.tokens.giveBack(tokens, make([]bool, count))
		return nil, ErrSubscriptionNotFound
	case "delivery_paused":
		q.tokens.giveBack(tokens, make([]bool, count))
		return nil, ErrDeliveryPaused
	case "subscription_paused":
		q.tokens.giveBack(tokens, make([]bool, count))
		return nil, ErrSubscriptionPaused
	default:
		return nil, ErrDataStateInvalid
	}
	now := int64At(res, 1)
	rows, ok := res[2].([]any)
	if !ok {
		return nil, ErrDataStateInvalid
	}
	used := make([]bool, count)
	out := make([]ClaimItem, 0, len(rows))
	for _, row := range rows {
		f, ok := row.([]any)
		if !ok || len(f) != 9 {
			return nil, ErrDataStateInvalid
		}
		id, _ := f[0].(string)
		p, _ := f[3].(string)
		c, _ := f[4].(string)
		d, _ := f[5].(string)
		idx := int64At(f, 8)
		if idx < 1 || idx > int64(count) || used[idx-1] {
			return nil, ErrDataStateInvalid
		}
		used[idx-1] = true
		lease := int64At(f, 2)
		out = append(out, ClaimItem{
			Message: TopicMessage{ID: id, TopicID: tid, ProducerID: p, ClientEventID: c, Payload: []byte(d),
				SizeBytes: int64At(f, 6), PublishedAt: int64At(f, 7)},
			Receipt: Receipt{MessageID: id, SubscriptionID: subID, Status: "leased", Attempts: int(int64At(f, 1)),
				LeaseUntil: lease, UpdatedAt: now},
			Token: tokens[idx-1].token, LeaseUntil: lease,
		})
	}
	q.tokens.giveBack(tokens, used)
	return out, nil
}

// Ack records the outcome of a leased message (status processed | failed).
// applied is false for an idempotent replay. Errors:
// ErrSubscriptionNotFound, ErrMessageNotFound, ErrLeaseExpired,
// ErrLeaseTokenMismatch, ErrReceiptConflict.
func (q *Queue) Ack(ctx context.Context, k Keys, subID, messageID, token, status, result string) (r Receipt, applied bool, err error) {
	if !validStreamID(messageID) {
		if _, err := q.topicOf(ctx, k, subID); err != nil {
			return Receipt{}, false, err
		}
		return Receipt{}, false, ErrMessageNotFound
	}
	sk, err := q.subKeysOf(ctx, k, subID)
	if err != nil {
		return Receipt{}, false, err
	}
	res, err := q.merge(newMergeCall(ctx, lua.ProjectTopicAck, true, sk.ack, []any{subID, sk.tid}, messageID, LeaseTokenHash(token), status, result))
	if err != nil {
		return Receipt{}, false, classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
	case "subscription_not_found":
		return Receipt{}, false, ErrSubscriptionNotFound
	case "message_not_found":
		return Receipt{}, false, ErrMessageNotFound
	case "lease_expired":
		return Receipt{}, false, ErrLeaseExpired
	case "lease_token_mismatch":
		return Receipt{}, false, ErrLeaseTokenMismatch
	case "receipt_conflict":
		return Receipt{}, false, ErrReceiptConflict
	default: // data_state_invalid
		return Receipt{}, false, ErrDataStateInvalid
	}
	raw, _ := res[1].(string)
	var rec receiptRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return Receipt{}, false, ErrDataStateInvalid
	}
	return rec.view(messageID, subID, 0), int64At(res, 2) == 1, nil
}
