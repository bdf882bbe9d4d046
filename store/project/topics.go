package project

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Project queue errors. Each maps to one stable code (docs/errors.md).
var (
	ErrTopicNotFound        = errors.New("project: topic not found")
	ErrTopicNameTaken       = errors.New("project: topic name taken")
	ErrSubscriptionNotFound = errors.New("project: subscription not found")
	ErrMessageNotFound      = errors.New("project: message not found")
	ErrPublishConflict      = errors.New("project: publish conflict")
	ErrSubscriptionPaused   = errors.New("project: subscription paused")
	ErrDeliveryPaused       = errors.New("project: delivery paused")
	ErrLeaseExpired         = errors.New("project: lease expired")
	ErrLeaseTokenMismatch   = errors.New("project: lease token mismatch")
	ErrReceiptConflict      = errors.New("project: receipt conflict")
	// ErrInvalidCursor: a page cursor (topic messages, cache listing) that
	// this service did not hand out.
	ErrInvalidCursor = errors.New("project: invalid cursor")
	// ErrBudgetExhausted: the project budget, the module budget or a
	// count limit (topics, subscriptions per project) would be passed.
	ErrBudgetExhausted = errors.New("project: budget exhausted")
)

// Project queue constants (docs/project-redis-api.md).
const (
	// dedupePurgeBatch bounds how many expired dedupe records one script
	// purges on the way.
	dedupePurgeBatch = 256
	// claimExpiredScan bounds how many expired leases one claim looks at.
	claimExpiredScan = 256
	// trimBatch is how many messages one trim script removes; Trim loops.
	trimBatch = 256
)

// QueueConfig tunes the project queue. Every zero value picks the default
// of limits.go named after it (tests shorten them).
type QueueConfig struct {
	Lease              time.Duration // zero value means LeaseDefault
	DedupeWindow       time.Duration // zero value means DedupeWindowDefault
	ProjectBudgetBytes int64         // zero value means ProjectBudgetBytes
	// ModuleBudgetBytes caps every project's reliable bytes together: the
	// cap (ModuleCap) of the ModuleBudget the queue is built with. Zero
	// value means ModuleBudgetBytes.
	ModuleBudgetBytes int64
	// MaxTopics and MaxSubscriptions cap how many a project holds (409
	// budget_exhausted beyond); zero value means MaxTopicsDefault and
	// MaxSubscriptionsDefault.
	MaxTopics        int
	MaxSubscriptions int
}

// ModuleCap is the module budget's cap under c.
func (c QueueConfig) ModuleCap() int64 {
	if c.ModuleBudgetBytes <= 0 {
		return ModuleBudgetBytes
	}
	return c.ModuleBudgetBytes
}

func (c QueueConfig) withDefaults() QueueConfig {
	if c.Lease <= 0 {
		c.Lease = LeaseDefault
	}
	if c.DedupeWindow <= 0 {
		c.DedupeWindow = DedupeWindowDefault
	}
	if c.ProjectBudgetBytes <= 0 {
		c.ProjectBudgetBytes = ProjectBudgetBytes
	}
	if c.MaxTopics <= 0 {
		c.MaxTopics = MaxTopicsDefault
	}
	if c.MaxSubscriptions <= 0 {
		c.MaxSubscriptions = MaxSubscriptionsDefault
	}
	return c
}

// Topic is one topic of a project. Timestamps are epoch ms.
type Topic struct {
	ID          string
	Name        string
	Description string
	CreatedAt   int64
}

// topicRecord is a topic as stored: its JSON in q:topics, written by the
// create script.
type topicRecord struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	CreatedAt   int64  `json:"createdAt"`
}

// Subscription is one subscription of a topic.
type Subscription struct {
	ID        string
	TopicID   string
	Name      string
	Status    string // online | paused
	CreatedAt int64
}

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

// PublishInput is one validated publish.
type PublishInput struct {
	ProducerID    string
	ClientEventID string
	Payload       []byte // canonical JSON object
}

// QueueState is what a snapshot shows of topics, subscriptions and the
// project budget.
type QueueState struct {
	Topics        []Topic
	Subscriptions []Subscription
	MessageBytes  int64
	ReceiptBytes  int64
	DedupeBytes   int64 // records not yet expired
}

// UsedBytes is the project's reliable bytes.
func (s QueueState) UsedBytes() int64 { return s.MessageBytes + s.ReceiptBytes + s.DedupeBytes }

// Queue is the Redis side of topics, subscriptions, claims, receipts
// and budgets. Messages live in one STREAM per topic (XADD without MAXLEN,
// XDEL on trim); a subscription is this package's own consumer group: a
// delivery position in the stream, a receipt per message and a lease index,
// because acks must be fenced by the lease token and attempts capped, which
// XREADGROUP/XCLAIM/XACK cannot express. Safe for concurrent use.
type Queue struct {
	rdb    redis.UniversalClient
	module *ModuleBudget
	cfg    QueueConfig

	mu       sync.Mutex          // guards subTopic and subsOf
	subTopic map[string]string   // project prefix + subscription id → topic id (never changes)
	subsOf   map[string][]string // project prefix + topic id → its subscription ids, as last seen

	settleFailures atomic.Int64
}

// NewQueue returns the project queue over the DB0 client.
func NewQueue(rdb redis.UniversalClient, module *ModuleBudget, cfg QueueConfig) *Queue {
	return &Queue{rdb: rdb, module: module, cfg: cfg.withDefaults(), subTopic: map[string]string{},
		subsOf: map[string][]string{}}
}

// Config is the configuration in force (defaults filled in).
func (q *Queue) Config() QueueConfig { return q.cfg }

// Module is the module budget the queue reserves on.
func (q *Queue) Module() *ModuleBudget { return q.module }

// SettleFailures counts module budget settlements that failed (the module
// counter then over-counts until the next reconcile).
func (q *Queue) SettleFailures() int64 { return q.settleFailures.Load() }

// settle runs phase two of the module budget protocol with a context the
// client cannot cancel: a refund must not be lost to a closed connection.
func (q *Queue) settle(ctx context.Context, r Reservation, added, released int64) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := q.module.Settle(sctx, r, added, released); err != nil {
		q.settleFailures.Add(1)
	}
}

// CreateTopic creates a topic; ErrTopicNameTaken when the name is in use,
// ErrBudgetExhausted beyond MaxTopics.
func (q *Queue) CreateTopic(ctx context.Context, k Keys, id, name, description string) (Topic, error) {
	res, err := lua.ProjectTopicCreate.Run(ctx, q.rdb, []string{k.Topics(), k.TopicNames()}, id, name, description, q.cfg.MaxTopics).Slice()
	if err != nil {
		return Topic{}, classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
		return Topic{ID: id, Name: name, Description: description, CreatedAt: int64At(res, 1)}, nil
	case "topic_name_taken":
		return Topic{}, ErrTopicNameTaken
	case "limit":
		return Topic{}, ErrBudgetExhausted
	}
	return Topic{}, ErrDataStateInvalid
}

// topicSubs returns the topic's subscription ids, sorted.
func (q *Queue) topicSubs(ctx context.Context, k Keys, topicID string) ([]string, error) {
	sids, err := q.rdb.SMembers(ctx, k.TopicSubscriptions(topicID)).Result()
	if err != nil {
		return nil, classifyProject(err)
	}
	slices.Sort(sids)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.subsOf) >= 1<<14 {
		clear(q.subsOf)
	}
	q.subsOf[k.Prefix()+topicID] = sids
	return sids, nil
}

// cachedTopicSubs is topicSubs as last seen by this instance (one round
// trip less per publish). The publish script compares the list with the
// topic's SET and answers 'retry' when it changed; the caller then reads
// it afresh.
func (q *Queue) cachedTopicSubs(ctx context.Context, k Keys, topicID string) ([]string, error) {
	q.mu.Lock()
	sids, ok := q.subsOf[k.Prefix()+topicID]
	q.mu.Unlock()
	if ok {
		return sids, nil
	}
	return q.topicSubs(ctx, k, topicID)
}

// DeleteTopic deletes a topic with its messages, subscriptions and receipts
// and releases their budget (dedupe records stay counted until expiry).
func (q *Queue) DeleteTopic(ctx context.Context, k Keys, projectID, topicID string) error {
	gen, err := q.module.Gen(ctx)
	if err != nil {
		return err
	}
	for range 5 {
		sids, err := q.topicSubs(ctx, k, topicID)
		if err != nil {
			return err
		}
		keys := []string{k.Topics(), k.TopicNames(), k.Subscriptions(), k.Budget(), k.Dedupe(), k.DedupeExpiry(),
			k.TopicStream(topicID), k.TopicSubscriptions(topicID), k.TopicOpen(topicID), k.TopicDone(topicID)}
		args := []any{topicID, ReceiptReserveBytes, dedupePurgeBatch, len(sids)}
		for _, sid := range sids {
			keys = append(keys, k.Receipts(sid), k.Leases(sid))
			args = append(args, sid)
		}
		res, err := lua.ProjectTopicDelete.Run(ctx, q.rdb, keys, args...).Slice()
		if err != nil {
			return classifyProject(err)
		}
		switch outcome(res) {
		case "ok":
			q.settle(ctx, Reservation{Gen: gen}, 0, int64At(res, 1))
			return nil
		case "topic_not_found":
			return ErrTopicNotFound
		case "retry":
			continue
		default:
			return ErrDataStateInvalid
		}
	}
	return rds.ErrRedisUnavailable
}

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

// DedupeRecordBytes is what a publish's dedupe record costs of the budget.
func DedupeRecordBytes(topicID, producerID, clientEventID string) int64 {
	return int64(len(publishIdentity(topicID, producerID, clientEventID))) + DedupeRecordOverhead
}

// Publish publishes one message. replay is true when the identity was
// published with the same canonical payload within the dedupe window: the
// stored message is returned (even when trim has removed it since).
// Errors: ErrTopicNotFound, ErrPublishConflict, ErrBudgetExhausted.
func (q *Queue) Publish(ctx context.Context, k Keys, projectID, topicID string, in PublishInput) (msg TopicMessage, replay bool, err error) {
	identity := publishIdentity(topicID, in.ProducerID, in.ClientEventID)
	fp := Fingerprint(in.Payload)
	size := int64(len(in.Payload))
	ddBytes := DedupeRecordBytes(topicID, in.ProducerID, in.ClientEventID)
	msg = TopicMessage{TopicID: topicID, ProducerID: in.ProducerID, ClientEventID: in.ClientEventID, Payload: in.Payload, SizeBytes: size}
	fresh := false
	for range 5 {
		var sids []string
		var err error
		if fresh {
			sids, err = q.topicSubs(ctx, k, topicID)
		} else {
			sids, err = q.cachedTopicSubs(ctx, k, topicID)
		}
		if err != nil {
			return TopicMessage{}, false, err
		}
		need := size + ddBytes + int64(len(sids))*ReceiptReserveBytes
		r, granted, err := q.module.Reserve(ctx, projectID, need)
		if err != nil {
			return TopicMessage{}, false, err
		}
		reserved := int64(0)
		if granted {
			reserved = need
		}
		keys := []string{k.Topics(), k.Budget(), k.Dedupe(), k.DedupeExpiry(), k.TopicStream(topicID),
			k.TopicSubscriptions(topicID), k.TopicOpen(topicID), k.TopicDone(topicID)}
		args := []any{topicID, identity, fp, in.ProducerID, in.ClientEventID, in.Payload, size, ddBytes, reserved,
			q.cfg.ProjectBudgetBytes, ReceiptReserveBytes, q.cfg.DedupeWindow.Milliseconds(), dedupePurgeBatch, len(sids)}
		for _, sid := range sids {
			keys = append(keys, k.Receipts(sid))
			args = append(args, sid)
		}
		res, err := lua.ProjectTopicPublish.Run(ctx, q.rdb, keys, args...).Slice()
		if err != nil {
			if granted {
				q.settle(ctx, r, 0, 0)
			}
			return TopicMessage{}, false, classifyProject(err)
		}
		if len(res) != 5 {
			if granted {
				q.settle(ctx, r, 0, 0)
			}
			return TopicMessage{}, false, ErrDataStateInvalid
		}
		added, purged := int64At(res, 3), int64At(res, 4)
		if granted || purged > 0 {
			q.settle(ctx, r, added, purged)
		}
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

// TrimResult is what one trim removed.
type TrimResult struct {
	Trimmed       int64
	ReleasedBytes int64
}

// Trim removes every message of the topic that is terminal for every
// subscription, with its receipts, and releases their budget. It works in
// bounded batches (each one atomic).
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
		args := []any{topicID, trimBatch, ReceiptMaxAttempts, ReceiptReserveBytes, dedupePurgeBatch, len(sids)}
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
		n, released, more := int64At(res, 1), int64At(res, 2), int64At(res, 3)
		q.settle(ctx, Reservation{Gen: gen}, 0, released)
		total.Trimmed += n
		total.ReleasedBytes += released
		if more == 0 {
			return total, nil
		}
	}
	return total, nil
}

// subRecord is a subscription as stored: its JSON in q:subs, written by
// the scripts, with the stream position its deliveries start from.
type subRecord struct {
	ID        string `json:"id"`
	TopicID   string `json:"topicId"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	CreatedAt int64  `json:"createdAt"`
	From      string `json:"from"`
	Pos       string `json:"pos"`
}

func (r subRecord) subscription() Subscription {
	return Subscription{ID: r.ID, TopicID: r.TopicID, Name: r.Name, Status: r.Status, CreatedAt: r.CreatedAt}
}

// CreateSubscription creates a subscription on a topic.
func (q *Queue) CreateSubscription(ctx context.Context, k Keys, id, topicID, name string) (Subscription, error) {
	res, err := lua.ProjectTopicSubCreate.Run(ctx, q.rdb, []string{k.Topics(), k.Subscriptions(), k.TopicSubscriptions(topicID), k.TopicStream(topicID)},
		id, topicID, name, q.cfg.MaxSubscriptions).Slice()
	if err != nil {
		return Subscription{}, classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
		q.rememberTopic(k, id, topicID)
		return Subscription{ID: id, TopicID: topicID, Name: name, Status: "online", CreatedAt: int64At(res, 1)}, nil
	case "topic_not_found":
		return Subscription{}, ErrTopicNotFound
	case "limit":
		return Subscription{}, ErrBudgetExhausted
	}
	return Subscription{}, ErrDataStateInvalid
}

// SetSubscriptionStatus sets online | paused.
func (q *Queue) SetSubscriptionStatus(ctx context.Context, k Keys, id, status string) (Subscription, error) {
	res, err := lua.ProjectTopicSubStatus.Run(ctx, q.rdb, []string{k.Subscriptions()}, id, status).Slice()
	if err != nil {
		return Subscription{}, classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
		raw, _ := res[1].(string)
		var rec subRecord
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			return Subscription{}, ErrDataStateInvalid
		}
		return rec.subscription(), nil
	case "subscription_not_found":
		return Subscription{}, ErrSubscriptionNotFound
	}
	return Subscription{}, ErrDataStateInvalid
}

func (q *Queue) rememberTopic(k Keys, subID, topicID string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.subTopic) >= 1<<16 {
		clear(q.subTopic)
	}
	q.subTopic[k.Prefix()+subID] = topicID
}

// topicOf returns the topic of a subscription (cached: it never changes;
// every script checks the subscription still exists).
func (q *Queue) topicOf(ctx context.Context, k Keys, subID string) (string, error) {
	q.mu.Lock()
	tid, ok := q.subTopic[k.Prefix()+subID]
	q.mu.Unlock()
	if ok {
		return tid, nil
	}
	raw, err := q.rdb.HGet(ctx, k.Subscriptions(), subID).Result()
	if errors.Is(err, redis.Nil) {
		return "", ErrSubscriptionNotFound
	}
	if err != nil {
		return "", classifyProject(err)
	}
	var rec subRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil || rec.TopicID == "" {
		return "", ErrDataStateInvalid
	}
	q.rememberTopic(k, subID, rec.TopicID)
	return rec.TopicID, nil
}

// DeleteSubscription deletes a subscription with its receipts and releases
// their budget.
func (q *Queue) DeleteSubscription(ctx context.Context, k Keys, projectID, subID string) error {
	tid, err := q.topicOf(ctx, k, subID)
	if err != nil {
		return err
	}
	gen, err := q.module.Gen(ctx)
	if err != nil {
		return err
	}
	res, err := lua.ProjectTopicSubDelete.Run(ctx, q.rdb, []string{k.Subscriptions(), k.Budget(), k.Dedupe(), k.DedupeExpiry(),
		k.TopicSubscriptions(tid), k.TopicOpen(tid), k.TopicDone(tid), k.Receipts(subID), k.Leases(subID)},
		subID, tid, ReceiptReserveBytes, dedupePurgeBatch).Slice()
	if err != nil {
		return classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
		q.settle(ctx, Reservation{Gen: gen}, 0, int64At(res, 1))
		return nil
	case "subscription_not_found":
		return ErrSubscriptionNotFound
	}
	return ErrDataStateInvalid
}

// receiptRecord is a receipt as stored (JSON in …:s:<sid>:r).
type receiptRecord struct {
	S string  `json:"s"`
	A int     `json:"a"`
	L int64   `json:"l"`
	U int64   `json:"u"`
	R *string `json:"r"`
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
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
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

// NewLeaseToken returns a fresh random lease token and the hash stored in
// its place.
func NewLeaseToken() (token, hash string) {
	var b [32]byte
	_, _ = rand.Read(b[:])
	token = base64.RawURLEncoding.EncodeToString(b[:])
	return token, LeaseTokenHash(token)
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
	tid, err := q.topicOf(ctx, k, subID)
	if err != nil {
		return nil, err
	}
	tokens := make([]string, count)
	args := make([]any, 0, 7+count)
	args = append(args, subID, tid, count, q.cfg.Lease.Milliseconds(), ReceiptMaxAttempts, b01(projectPaused), claimExpiredScan)
	for i := range tokens {
		var h string
		tokens[i], h = NewLeaseToken()
		args = append(args, h)
	}
	res, err := lua.ProjectTopicClaim.Run(ctx, q.rdb, []string{k.Topics(), k.Subscriptions(), k.TopicStream(tid), k.TopicOpen(tid),
		k.TopicDone(tid), k.Receipts(subID), k.Leases(subID)}, args...).Slice()
	if err != nil {
		return nil, classifyProject(err)
	}
	switch outcome(res) {
	case "ok":
	case "subscription_not_found":
		return nil, ErrSubscriptionNotFound
	case "delivery_paused":
		return nil, ErrDeliveryPaused
	case "subscription_paused":
		return nil, ErrSubscriptionPaused
	default:
		return nil, ErrDataStateInvalid
	}
	now := int64At(res, 1)
	rows, ok := res[2].([]any)
	if !ok {
		return nil, ErrDataStateInvalid
	}
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
		if idx < 1 || idx > int64(count) {
			return nil, ErrDataStateInvalid
		}
		lease := int64At(f, 2)
		out = append(out, ClaimItem{
			Message: TopicMessage{ID: id, TopicID: tid, ProducerID: p, ClientEventID: c, Payload: []byte(d),
				SizeBytes: int64At(f, 6), PublishedAt: int64At(f, 7)},
			Receipt: Receipt{MessageID: id, SubscriptionID: subID, Status: "leased", Attempts: int(int64At(f, 1)),
				LeaseUntil: lease, UpdatedAt: now},
			Token: tokens[idx-1], LeaseUntil: lease,
		})
	}
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
	tid, err := q.topicOf(ctx, k, subID)
	if err != nil {
		return Receipt{}, false, err
	}
	res, err := lua.ProjectTopicAck.Run(ctx, q.rdb, []string{k.Subscriptions(), k.TopicOpen(tid), k.TopicDone(tid),
		k.Receipts(subID), k.Leases(subID)}, subID, tid, messageID, LeaseTokenHash(token), status, result).Slice()
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
	default:
		return Receipt{}, false, ErrDataStateInvalid
	}
	raw, _ := res[1].(string)
	var rec receiptRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return Receipt{}, false, ErrDataStateInvalid
	}
	return rec.view(messageID, subID, 0), int64At(res, 2) == 1, nil
}

// State reads topics, subscriptions and the project budget (a no-writes
// script: works under OOM).
func (q *Queue) State(ctx context.Context, k Keys) (QueueState, error) {
	res, err := lua.ProjectTopicState.Run(ctx, q.rdb, []string{k.Topics(), k.Subscriptions(), k.Budget(), k.Dedupe(), k.DedupeExpiry()},
		dedupePurgeBatch*4).Slice()
	if err != nil {
		return QueueState{}, classifyProject(err)
	}
	if len(res) != 6 {
		return QueueState{}, ErrDataStateInvalid
	}
	st := QueueState{MessageBytes: int64At(res, 1), ReceiptBytes: int64At(res, 2), DedupeBytes: int64At(res, 3)}
	topics, ok1 := res[4].([]any)
	subs, ok2 := res[5].([]any)
	if !ok1 || !ok2 {
		return QueueState{}, ErrDataStateInvalid
	}
	for i := 1; i < len(topics); i += 2 {
		raw, _ := topics[i].(string)
		var t topicRecord
		if err := json.Unmarshal([]byte(raw), &t); err != nil {
			return QueueState{}, ErrDataStateInvalid
		}
		st.Topics = append(st.Topics, Topic(t))
	}
	for i := 1; i < len(subs); i += 2 {
		raw, _ := subs[i].(string)
		var s subRecord
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			return QueueState{}, ErrDataStateInvalid
		}
		st.Subscriptions = append(st.Subscriptions, s.subscription())
	}
	slices.SortFunc(st.Topics, func(a, b Topic) int {
		if a.CreatedAt != b.CreatedAt {
			return int(a.CreatedAt - b.CreatedAt)
		}
		return strings.Compare(a.ID, b.ID)
	})
	slices.SortFunc(st.Subscriptions, func(a, b Subscription) int {
		if a.CreatedAt != b.CreatedAt {
			return int(a.CreatedAt - b.CreatedAt)
		}
		return strings.Compare(a.ID, b.ID)
	})
	return st, nil
}

// StreamCursor is the opaque listing cursor after message id.
func StreamCursor(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// ParseStreamCursor returns the message id a cursor stands for ("" for
// the first page); ErrInvalidCursor for anything the server did not issue.
func ParseStreamCursor(c string) (string, error) {
	if c == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || !validStreamID(string(b)) {
		return "", ErrInvalidCursor
	}
	return string(b), nil
}

// validStreamID reports whether s has the form of a message id,
// "<ms>-<seq>" in decimal.
func validStreamID(s string) bool {
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

// outcome is the first element of a script's answer.
func outcome(res []any) string {
	if len(res) == 0 {
		return ""
	}
	s, _ := res[0].(string)
	return s
}

// int64At reads an integer element of a script's answer (0 when absent).
func int64At(res []any, i int) int64 {
	if i >= len(res) {
		return 0
	}
	switch v := res[i].(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}
