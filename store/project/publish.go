package project

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// TopicMessage is one published message; Payload is its RFC 8785 canonical JSON.
type TopicMessage struct {
	ID            string
	TopicID       string
	ProducerID    string
	ClientEventID string
	Payload       []byte
	SizeBytes     int64 // bytes of the canonical payload
	PublishedAt   int64
}

// PublishInput is one validated publish.
type PublishInput struct {
	ProducerID    string
	ClientEventID string
	Payload       []byte // canonical JSON object
}

// QueueState is what a snapshot shows of topics, subscriptions and the
// Fingerprint is the hex SHA-256 of a canonical payload.
func Fingerprint(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// publishIdentity is the dedupe identity; producerId and clientEventId
// hold no control characters, so the separator is unambiguous.
func publishIdentity(topicID, producerID, clientEventID string) string {
	return topicID + "\n" + producerID + "\n" + clientEventID
}

// DedupeRecordBytes is what a publish's dedupe record costs of the budget:
// its identity twice (the record's field and its expiry's member) and
// DedupeRecordOverhead.
func DedupeRecordBytes(topicID, producerID, clientEventID string) int64 {
	return 2*int64(len(publishIdentity(topicID, producerID, clientEventID))) + DedupeRecordOverhead
}

// MessageBytes is what a message costs of the budget until it is trimmed:
// the strings its stream entry stores (payload, producerId,
// clientEventId) and MessageOverheadBytes. The entry stores its charge,
// and trim releases what is stored.
func MessageBytes(producerID, clientEventID string, payload []byte) int64 {
	return int64(len(payload)+len(producerID)+len(clientEventID)) + MessageOverheadBytes
}

// Publish publishes one message. replay is true when the identity was
// published with the same canonical payload within the dedupe window: the
// stored message is returned (even when trim has removed it since).
// Errors: ErrTopicNotFound, ErrPublishConflict, ErrBudgetExhausted.
func (q *Queue) Publish(ctx context.Context, k Keys, projectID, topicID string, in PublishInput) (msg TopicMessage, replay bool, err error) {
	identity := publishIdentity(topicID, in.ProducerID, in.ClientEventID)
	fp := Fingerprint(in.Payload)
	size := MessageBytes(in.ProducerID, in.ClientEventID, in.Payload)
	ddBytes := DedupeRecordBytes(topicID, in.ProducerID, in.ClientEventID)
	msg = TopicMessage{TopicID: topicID, ProducerID: in.ProducerID, ClientEventID: in.ClientEventID, Payload: in.Payload,
		SizeBytes: int64(len(in.Payload))}
	fresh := false
	for range 5 {
		t, err := q.publishKeys(ctx, k, topicID, fresh)
		if err != nil {
			return TopicMessage{}, false, err
		}
		need := size + ddBytes + int64(len(t.sids))*ReceiptReserveBytes
		g, err := q.leases.acquire(ctx, projectID, need)
		if err != nil {
			return TopicMessage{}, false, err
		}
		reserved := int64(0)
		if g.granted {
			reserved = need
		}
		res, err := q.merge(newMergeCall(ctx, lua.ProjectTopicPublish, true, t.pubKeys, t.pubHead,
			identity, fp, in.ProducerID, in.ClientEventID, in.Payload, size, ddBytes, reserved))
		if err != nil {
			// A script that got no reply may still run (a Redis that
			// stalls runs what it had received when it wakes) and keep the
			// bytes: the module keeps them counted, an over-count the next
			// reconcile corrects, rather than a refund that would let the
			// module pass its cap.
			added := int64(0)
			if rds.Unanswered(err) {
				added = reserved
			}
			q.done(ctx, g, added, 0)
			return TopicMessage{}, false, classifyProject(err)
		}
		if len(res) != 5 {
			q.done(ctx, g, 0, 0)
			return TopicMessage{}, false, ErrDataStateInvalid
		}
		q.done(ctx, g, int64At(res, 3), int64At(res, 4))
		switch outcome(res) {
		case "created":
			msg.ID, _ = res[1].(string)
			msg.PublishedAt = int64At(res, 2)
			return msg, false, nil
		case "replay":
			msg.ID, _ = res[1].(string)
			msg.PublishedAt = int64At(res, 2)
			return msg, true, nil
		case "conflict":
			return TopicMessage{}, false, ErrPublishConflict
		case "budget", "module":
			return TopicMessage{}, false, ErrBudgetExhausted
		case "topic_not_found":
			return TopicMessage{}, false, ErrTopicNotFound
		case "retry":
			fresh = true
			continue
		default:
			return TopicMessage{}, false, ErrDataStateInvalid
		}
	}
	// The topic's subscriptions kept changing under us.
	return TopicMessage{}, false, rds.ErrRedisUnavailable
}

// ListMessages returns one page of a topic's messages after the cursor (""
// for the first page) and the cursor of the next page ("" at the end).
func (q *Queue) ListMessages(ctx context.Context, k Keys, topicID, cursor string, limit int) ([]TopicMessage, string, error) {
	after, err := ParseStreamCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	res, err := lua.ProjectTopicMessages.Run(ctx, q.rdb, []string{k.Topics(), k.TopicStream(topicID)}, topicID, after, limit).Slice()
	if err != nil {
		return nil, "", classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
	case "topic_not_found":
		return nil, "", ErrTopicNotFound
	default:
		return nil, "", ErrDataStateInvalid
	}
	entries, ok1 := res[1].([]any)
	more, ok2 := res[2].(int64)
	if !ok1 || !ok2 {
		return nil, "", ErrDataStateInvalid
	}
	out := make([]TopicMessage, 0, len(entries))
	for _, e := range entries {
		m, ok := parseStreamMessage(topicID, e)
		if !ok {
			return nil, "", ErrDataStateInvalid
		}
		out = append(out, m)
	}
	next := ""
	if more == 1 && len(out) > 0 {
		next = StreamCursor(out[len(out)-1].ID)
	}
	return out, next, nil
}

// parseStreamMessage reads one XRANGE entry {id, {field, value, …}}.
func parseStreamMessage(topicID string, e any) (TopicMessage, bool) {
	pair, ok := e.([]any)
	if !ok || len(pair) != 2 {
		return TopicMessage{}, false
	}
	id, ok1 := pair[0].(string)
	fv, ok2 := pair[1].([]any)
	if !ok1 || !ok2 || len(fv)%2 != 0 {
		return TopicMessage{}, false
	}
	m := TopicMessage{ID: id, TopicID: topicID}
	seen := 0
	for i := 0; i < len(fv); i += 2 {
		f, _ := fv[i].(string)
		v, _ := fv[i+1].(string)
		switch f {
		case "p":
			m.ProducerID = v
		case "c":
			m.ClientEventID = v
		case "d":
			m.Payload = []byte(v)
		case "z":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return TopicMessage{}, false
			}
			m.SizeBytes = n
		case "a":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return TopicMessage{}, false
			}
			m.PublishedAt = n
		default:
			continue
		}
		seen++
	}
	return m, seen == 5
}

// TrimResult is what one trim removed: ReleasedBytes are the message and
// receipt bytes of the trimmed messages. The expired dedupe records a trim
// purges on the way are released from the budgets too, but are not the
// trim's doing and not counted here.
type TrimResult struct {
	Trimmed       int64
	ReleasedBytes int64
}

// Trim removes every message of the topic that is terminal for every
// subscription, with its receipts, and releases their budget. It works in
// bounded batches (each one atomic): up to 256 messages, fewer when the
// topic has more than 16 subscriptions (trimReceiptLookups).
func (q *Queue) Trim(ctx context.Context, k Keys, projectID, topicID string) (TrimResult, error) {
	gen, err := q.module.Gen(ctx)
	if err != nil {
		return TrimResult{}, err
	}
	var total TrimResult
	for range 10000 {
		sids, err := q.topicSubs(ctx, k, topicID)
		if err != nil {
			return total, err
		}
		keys := []string{k.Topics(), k.Budget(), k.Dedupe(), k.DedupeExpiry(), k.TopicStream(topicID),
			k.TopicSubscriptions(topicID), k.TopicOpen(topicID), k.TopicDone(topicID)}
		args := []any{topicID, trimBatchFor(len(sids)), ReceiptMaxAttempts, ReceiptReserveBytes, dedupePurgeBatch, len(sids)}
		for _, sid := range sids {
			keys = append(keys, k.Receipts(sid), k.Leases(sid))
			args = append(args, sid)
		}
		res, err := lua.ProjectTopicTrim.Run(ctx, q.rdb, keys, args...).Slice()
		if err != nil {
			return total, classifyProject(err)
		}
		switch outcome(res) {
		case "ok":
		case "topic_not_found":
			if total.Trimmed > 0 {
				return total, nil
			}
			return total, ErrTopicNotFound
		case "retry":
			continue
		default:
			return total, ErrDataStateInvalid
		}
		n, released, more, purged := int64At(res, 1), int64At(res, 2), int64At(res, 3), int64At(res, 4)
		q.settle(ctx, Reservation{Gen: gen}, 0, released+purged)
		total.Trimmed += n
		total.ReleasedBytes += released
		if more == 0 {
			return total, nil
		}
	}
	return total, nil
}

// trimBatchFor is the batch of one trim script on a topic with subs
// subscriptions: at most trimBatch messages and trimReceiptLookups
// receipt lookups, and at least one message.
func trimBatchFor(subs int) int {
	if subs <= 1 {
		return trimBatch
	}
	return max(1, min(trimBatch, trimReceiptLookups/subs))
}

// StreamCursor is the opaque listing cursor after message id.
func StreamCursor(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// ParseStreamCursor returns the message id a cursor stands for ("" for
// the first page); ErrInvalidCursor for anything the server did not issue.
func ParseStreamCursor(c string) (string, error) {
	if c == "" {
		return "", nil
	}
	// Only the spelling StreamCursor issues: the decoder also takes
	// non-zero padding bits and skips CR and LF.
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || StreamCursor(string(b)) != c || !validStreamID(string(b)) {
		return "", ErrInvalidCursor
	}
	return string(b), nil
}

// maxStreamID is the largest id a stream can hold. No message has it (ids
// are assigned from the clock), and as an exclusive listing start it has no
// successor: Redis refuses the range.
const maxStreamID = "18446744073709551615-18446744073709551615"

// validStreamID reports whether s has the form of a message id,
// "<ms>-<seq>" in decimal, and can start a listing after it.
func validStreamID(s string) bool {
	if s == maxStreamID {
		return false
	}
	ms, seq, ok := strings.Cut(s, "-")
	if !ok || len(ms) == 0 || len(ms) > 20 || len(seq) == 0 || len(seq) > 20 {
		return false
	}
	for _, part := range []string{ms, seq} {
		if _, err := strconv.ParseUint(part, 10, 64); err != nil || (len(part) > 1 && part[0] == '0') {
			return false
		}
	}
	return true
}
