package project_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/han-app/gateway/store/project"
)

// Concurrent publishes, claims and acks share pipelines. Each call still
// gets its own script's answer: every message is delivered once and acked
// once, a replay answers with its own message, and a script Redis lost
// (SCRIPT FLUSH, as after a restart) is loaded again for calls that were
// sent in a pipeline.
func TestQueueConcurrentCallsEachGetTheirOwnAnswer(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	ctx := context.Background()
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	// Redis forgets the scripts again and again while the calls run.
	flushing, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flushing)
		for {
			select {
			case <-stop:
				return
			default:
				e.admin.ScriptFlush(ctx)
			}
		}
	}()
	defer func() {
		close(stop)
		<-flushing
	}()
	const producers, perProducer = 8, 40
	ids := make([][]string, producers)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range perProducer {
				m, replay, err := q.Publish(ctx, tp.k, tp.pid, tp.tid, project.PublishInput{ProducerID: "p" + strconv.Itoa(p),
					ClientEventID: strconv.Itoa(i), Payload: []byte(`{"n":` + strconv.Itoa(p*1000+i) + `}`)})
				if err != nil || replay {
					t.Error(err, replay)
					return
				}
				ids[p] = append(ids[p], m.ID)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// Replays in parallel: each gets the id its own publish stored.
	for p := range producers {
		wg.Go(func() {
			for i := range perProducer {
				m, replay, err := q.Publish(ctx, tp.k, tp.pid, tp.tid, project.PublishInput{ProducerID: "p" + strconv.Itoa(p),
					ClientEventID: strconv.Itoa(i), Payload: []byte(`{"n":` + strconv.Itoa(p*1000+i) + `}`)})
				if err != nil || !replay || m.ID != ids[p][i] {
					t.Error("replay", p, i, m.ID, replay, err)
					return
				}
			}
		})
	}
	wg.Wait()

	var mu sync.Mutex
	seen := map[string]int{}
	payloads := map[string]string{}
	for range 8 {
		wg.Go(func() {
			for {
				items, err := q.Claim(ctx, tp.k, tp.sid, 5, false)
				if err != nil {
					t.Error(err)
					return
				}
				if len(items) == 0 {
					return
				}
				for _, it := range items {
					if _, applied, err := q.Ack(ctx, tp.k, tp.sid, it.Message.ID, it.Token, "processed", ""); err != nil || !applied {
						t.Error("ack", it.Message.ID, applied, err)
					}
					mu.Lock()
					seen[it.Message.ID]++
					payloads[it.Message.ID] = string(it.Message.Payload)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for p := range producers {
		for i, id := range ids[p] {
			if seen[id] != 1 {
				t.Fatalf("message %s delivered %d times", id, seen[id])
			}
			if want := `{"n":` + strconv.Itoa(p*1000+i) + `}`; payloads[id] != want {
				t.Fatalf("message %s carried %s, want %s", id, payloads[id], want)
			}
		}
	}
	if len(seen) != producers*perProducer {
		t.Fatalf("delivered %d messages, want %d", len(seen), producers*perProducer)
	}
}

// A call whose context has ended is not sent.
func TestQueueCanceledCallWritesNothing(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	before := dumpKeys(t, e.admin, tp.k.Prefix())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := q.Publish(ctx, tp.k, tp.pid, tp.tid, project.PublishInput{ProducerID: "p", ClientEventID: "e", Payload: []byte(`{}`)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want a canceled call", err)
	}
	if dumpKeys(t, e.admin, tp.k.Prefix()) != before {
		t.Fatal("a canceled publish wrote to Redis")
	}
}
