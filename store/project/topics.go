package project

import (
	"context"
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
	// trimReceiptLookups bounds one trim script's messages x subscriptions:
	// each message of a batch is looked up in every subscription's
	// receipts, so a topic with many subscriptions trims in smaller
	// batches and no script holds Redis for long.
	trimReceiptLookups = 4096
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
	// ModuleLeaseBytes is the lease this instance takes on the module
	// budget so its publishes skip the module calls (lease.go); at most
	// ModuleLeaseMaxBytes. Unlike the other fields its zero value means no
	// leases: every publish reserves its bytes exactly.
	ModuleLeaseBytes int64
	// RedisBudget bounds a publish, claim or ack from the moment it is
	// queued for a shared round trip to its reply, so a caller never waits
	// past it for the round trips ahead of it (a stalled Redis would hold
	// every queued caller one budget each). Zero value means one second,
	// the service's default Redis budget.
	RedisBudget time.Duration
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
	if c.RedisBudget <= 0 {
		c.RedisBudget = time.Second
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

// valid reports whether a stored topic record is one: a JSON object (not
// null) naming the id it is stored under, with a name. Anything else is an
// unreadable record (data_state_invalid), never a topic shown without an
// id.
func (r topicRecord) valid(id string) bool { return r.ID == id && id != "" && r.Name != "" }

// Subscription is one subscription of a topic.
type Subscription struct {
	ID        string
	TopicID   string
	Name      string
	Status    string // online | paused
	CreatedAt int64
}

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
	leases *moduleLeases
	batch  *rds.Batcher
	// mergers gathers publish, claim and ack calls (merge.go), one
	// *combine.Combiner[*mergeCall] per node of the batcher (rds.Batcher.NodeOf).
	mergers sync.Map
	tokens  tokenPool // lease tokens claims did not use (tokens.go)
	cfg     QueueConfig

	mu       sync.Mutex               // guards subTopic and subsOf
	subTopic map[idKey]*subKeys       // subscription → its topic (never changes) and script keys
	subsOf   map[idKey]*topicSubsKeys // topic → its subscription ids as last seen, and publish keys

	settleFailures atomic.Int64
}

// NewQueue returns the project queue over the DB0 client.
func NewQueue(rdb redis.UniversalClient, module *ModuleBudget, cfg QueueConfig) *Queue {
	cfg = cfg.withDefaults()
	return &Queue{rdb: rdb, module: module, leases: newModuleLeases(module, cfg.ModuleLeaseBytes, cfg.RedisBudget), batch: rds.NewBatcher(rdb), cfg: cfg,
		subTopic: map[idKey]*subKeys{}, subsOf: map[idKey]*topicSubsKeys{}}
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

// done ends a write's grant on the module budget (lease.go); its module
// calls, if any, run with a context the client cannot cancel, like settle.
func (q *Queue) done(ctx context.Context, g grant, added, released int64) {
	if err := q.leases.done(ctx, g, added, released); err != nil {
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
	t, err := q.readTopicSubs(ctx, k, topicID)
	if err != nil {
		return nil, err
	}
	return t.sids, nil
}

// readTopicSubs reads the topic's subscription ids and keeps them, with
// the publish keys for them, as last seen.
func (q *Queue) readTopicSubs(ctx context.Context, k Keys, topicID string) (*topicSubsKeys, error) {
	sids, err := q.rdb.SMembers(ctx, k.TopicSubscriptions(topicID)).Result()
	if err != nil {
		return nil, classifyProject(err)
	}
	slices.Sort(sids)
	t := q.newTopicSubsKeys(k, topicID, sids)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.subsOf) >= subsOfMax {
		clear(q.subsOf)
	}
	q.subsOf[idKey{k.Prefix(), topicID}] = t
	return t, nil
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

// valid reports whether a stored subscription record is one: a JSON object
// naming the id it is stored under, its topic and a name, with the status
// online or paused.
func (r subRecord) valid(id string) bool {
	return r.ID == id && id != "" && r.TopicID != "" && r.Name != "" && (r.Status == "online" || r.Status == "paused")
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

func (q *Queue) rememberTopic(k Keys, subID, topicID string) *subKeys {
	sk := newSubKeys(k, subID, topicID)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.subTopic) >= subTopicMax {
		clear(q.subTopic)
	}
	q.subTopic[idKey{k.Prefix(), subID}] = sk
	return sk
}

// topicOf returns the topic of a subscription (cached: it never changes;
// every script checks the subscription still exists).
func (q *Queue) topicOf(ctx context.Context, k Keys, subID string) (string, error) {
	sk, err := q.subKeysOf(ctx, k, subID)
	if err != nil {
		return "", err
	}
	return sk.tid, nil
}

// subKeysOf is topicOf with the subscription's script keys.
func (q *Queue) subKeysOf(ctx context.Context, k Keys, subID string) (*subKeys, error) {
	q.mu.Lock()
	sk, ok := q.subTopic[idKey{k.Prefix(), subID}]
	q.mu.Unlock()
	if ok {
		return sk, nil
	}
	raw, err := q.rdb.HGet(ctx, k.Subscriptions(), subID).Result()
	if errors.Is(err, redis.Nil) {
		return nil, ErrSubscriptionNotFound
	}
	if err != nil {
		return nil, classifyProject(err)
	}
	var rec subRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil || rec.TopicID == "" {
		return nil, ErrDataStateInvalid
	}
	return q.rememberTopic(k, subID, rec.TopicID), nil
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
		id, _ := topics[i-1].(string)
		raw, _ := topics[i].(string)
		var t topicRecord
		if err := json.Unmarshal([]byte(raw), &t); err != nil || !t.valid(id) {
			return QueueState{}, ErrDataStateInvalid
		}
		st.Topics = append(st.Topics, Topic(t))
	}
	for i := 1; i < len(subs); i += 2 {
		id, _ := subs[i-1].(string)
		raw, _ := subs[i].(string)
		var s subRecord
		if err := json.Unmarshal([]byte(raw), &s); err != nil || !s.valid(id) {
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
