package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// producerID is the producerId of every soak publish.
const producerID = "han-soak"

// queue drives one topic with one subscription of the soak's project:
// a producer publishing with a fresh clientEventId per message (retried
// with the same one), consumers claiming and acknowledging, and a trimmer.
// Safe for concurrent use.
type queue struct {
	r *runner
	// producer and consumer are members with write permission: two users,
	// so each stays inside its per-user limit of the project API.
	producer, consumer loadtest.User
	root               string // /projects/<id>/redis
	topicID            string
	subID              string

	mu          sync.Mutex
	published   map[string]*pubState // by message id
	confirmedDD int64                // dedupe bytes of confirmed publishes
	unsureDD    int64                // dedupe bytes of publishes whose answer was lost
	redelivered []redelivery
	acks        int
}

// pubState is what the soak knows of one published message.
type pubState struct {
	publishedAt time.Time // the 201/200 arrived (zero: claimed before the answer was read)
	ackedAt     time.Time // zero: not acknowledged
	dedupe      int64     // its dedupe record's bytes
}

// redelivery is a claim of a message after its acknowledgement.
type redelivery struct {
	id              string
	ackedAt, seenAt time.Time
}

func (q *queue) setup(ctx context.Context) error {
	var topic, sub struct {
		ID string `json:"id"`
	}
	api := q.r.api[0]
	if _, err := api.DoRetry(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/topics",
		Path: q.root + "/topics", Token: q.producer.Token, Body: map[string]any{"name": "soak", "description": "han soak"},
		Out: &topic, OK: []int{http.StatusCreated}}, 30*time.Second); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	if _, err := api.DoRetry(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/subscriptions",
		Path: q.root + "/subscriptions", Token: q.producer.Token, Body: map[string]any{"topicId": topic.ID, "name": "soak"},
		Out: &sub, OK: []int{http.StatusCreated}}, 30*time.Second); err != nil {
		return fmt.Errorf("create subscription: %w", err)
	}
	q.topicID, q.subID = topic.ID, sub.ID
	return nil
}

// publish sends one message, retrying with the same identity and the same
// payload (a replay must be byte-equal to count as the same publish).
func (q *queue) publish(ctx context.Context, rng *rand.Rand) {
	ev := ids.New()
	rec := DedupeRecordBytes(q.topicID, producerID, ev)
	gw := rng.IntN(2)
	deadline := time.Now().Add(q.r.cfg.RetryFor)
	for attempt := 0; ; attempt++ {
		var out struct {
			ID      string `json:"id"`
			Message struct {
				ID string `json:"id"`
			} `json:"message"`
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := q.r.api[gw].Do(actx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/topics/{topicId}/messages",
			Path: q.root + "/topics/" + q.topicID + "/messages", Token: q.producer.Token,
			Body: map[string]any{"producerId": producerID, "clientEventId": ev, "payload": map[string]any{"event": ev}},
			Out:  &out, OK: []int{http.StatusCreated, http.StatusOK}})
		cancel()
		if err == nil {
			id := out.ID
			if id == "" {
				id = out.Message.ID
			}
			q.mu.Lock()
			st := q.state(id)
			st.publishedAt, st.dedupe = time.Now(), rec
			q.confirmedDD += rec
			q.mu.Unlock()
			return
		}
		if ctx.Err() != nil {
			break
		}
		q.r.tl.err(errCode(err))
		if ok, ra := retryable(err); !ok || time.Now().After(deadline) || !sleepCtx(ctx, backoff(rng, attempt, ra, time.Second)) {
			break
		}
		gw = 1 - gw
	}
	// The publish may have been stored although its answer was lost.
	q.mu.Lock()
	q.unsureDD += rec
	q.mu.Unlock()
}

// consume claims and acknowledges until ctx ends.
func (q *queue) consume(ctx context.Context, rng *rand.Rand, gw int) {
	for attempt := 0; ctx.Err() == nil; {
		var res struct {
			Items []struct {
				Message struct {
					ID string `json:"id"`
				} `json:"message"`
				Token string `json:"token"`
			} `json:"items"`
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := q.r.api[gw].Do(actx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/subscriptions/{subscriptionId}/claim",
			Path: q.root + "/subscriptions/" + q.subID + "/claim", Token: q.consumer.Token, Body: map[string]any{"count": 10},
			Out: &res, OK: []int{http.StatusOK}})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			q.r.tl.err(errCode(err))
			_, ra := retryable(err)
			sleepCtx(ctx, backoff(rng, attempt, ra, time.Second))
			attempt++
			gw = 1 - gw
			continue
		}
		attempt = 0
		if len(res.Items) == 0 {
			sleepCtx(ctx, 500*time.Millisecond)
			continue
		}
		for _, it := range res.Items {
			q.mu.Lock()
			if st := q.state(it.Message.ID); !st.ackedAt.IsZero() {
				q.redelivered = append(q.redelivered, redelivery{it.Message.ID, st.ackedAt, time.Now()})
			}
			q.mu.Unlock()
			q.ack(ctx, rng, gw, it.Message.ID, it.Token)
		}
	}
}

// ack posts the receipt, retrying the same token while the answer is
// unknown; a lease that expired meanwhile is claimed again later.
func (q *queue) ack(ctx context.Context, rng *rand.Rand, gw int, msgID, token string) {
	for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := q.r.api[gw].Do(actx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/subscriptions/{subscriptionId}/receipts",
			Path: q.root + "/subscriptions/" + q.subID + "/receipts", Token: q.consumer.Token,
			Body: map[string]any{"messageId": msgID, "token": token, "status": "processed", "result": ""},
			OK:   []int{http.StatusOK}})
		cancel()
		if err == nil {
			q.mu.Lock()
			if st := q.state(msgID); st.ackedAt.IsZero() {
				st.ackedAt = time.Now()
			}
			q.acks++
			q.mu.Unlock()
			return
		}
		if ctx.Err() != nil {
			return
		}
		q.r.tl.err(errCode(err))
		ok, ra := retryable(err)
		if !ok {
			return
		}
		sleepCtx(ctx, backoff(rng, attempt, ra, time.Second))
		gw = 1 - gw
	}
}

// trim releases the bytes of acknowledged messages; it reports success.
func (q *queue) trim(ctx context.Context, gw int) bool {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := q.r.api[gw].Do(actx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/topics/{topicId}/trim",
		Path: q.root + "/topics/" + q.topicID + "/trim", Token: q.producer.Token, Body: map[string]any{}, OK: []int{http.StatusOK}})
	if err != nil && ctx.Err() == nil {
		q.r.tl.err(errCode(err))
	}
	return err == nil
}

// state returns the message's record, creating it; q.mu must be held.
func (q *queue) state(id string) *pubState {
	st, ok := q.published[id]
	if !ok {
		st = &pubState{}
		q.published[id] = st
	}
	return st
}

// unacked lists the published messages without an ack.
func (q *queue) unacked() []*pubState {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*pubState
	for _, st := range q.published {
		if st.ackedAt.IsZero() {
			out = append(out, st)
		}
	}
	return out
}
