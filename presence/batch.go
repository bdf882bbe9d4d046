package presence

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/combine"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Registration batching. Connects and disconnects that arrive together
// share one pipeline: each connection keeps its own atomic script (its
// user's hash tag), and the instance index gets one command for the whole
// batch. A lone call goes out at once (or after Config.Linger, while the
// calls that arrive meanwhile join it); while a batch is in flight the next
// calls queue, so a storm of thousands of handshakes or a drain of
// thousands of sockets costs one round trip per batch instead of one (or
// two) per connection, and nothing waits for a pool connection.
const (
	// opsInFlight is how many pipelines run at once.
	opsInFlight = 2
	// opsBatchMax bounds one pipeline.
	opsBatchMax = 256
	// opsTimeout bounds one pipeline; it does not end with any one caller.
	opsTimeout = 2 * time.Second
)

type opKind int

const (
	opConnect opKind = iota
	opDisconnect
)

// presenceOp is one connect or disconnect waiting in a batch.
type presenceOp struct {
	kind opKind
	conn Conn
	// score (disconnect): the score with which the batch listed the
	// user's offline check in the instance's index.
	score int64

	reply []any // the connection's script reply
	err   error
	done  chan struct{}
}

// opBatcher runs presence ops in shared pipelines.
type opBatcher struct {
	p *Presence

	// linger is how long an op that finds a pipeline free waits for
	// company (0: none).
	linger time.Duration

	mu       sync.Mutex
	queue    []*presenceOp
	inFlight int
	company  combine.Company // a caller waiting for linger
}

// do runs op and waits for its reply, or returns ctx's error if ctx ends
// while op still waits in the queue (nothing of it was sent).
func (b *opBatcher) do(ctx context.Context, op *presenceOp) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op.done = make(chan struct{})
	b.mu.Lock()
	b.queue = append(b.queue, op)
	b.company.Joined(len(b.queue))
	if !b.company.Waiting() && b.inFlight < opsInFlight {
		// A free pipeline: this caller sends the batch it is in itself (a
		// lone call costs no hand-off) and leaves the rest to a drain.
		// With a linger it first waits for others to join it; meanwhile
		// they queue behind it.
		b.inFlight++
		if b.linger > 0 && len(b.queue) < opsBatchMax {
			b.company.Wait(&b.mu, b.linger, opsBatchMax)
		}
		batch := b.takeLocked()
		b.mu.Unlock()
		b.sendAll(batch)
		if b.next() {
			go b.drain()
		}
	} else {
		b.mu.Unlock()
	}
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	for i, q := range b.queue {
		if q == op {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			b.mu.Unlock()
			return ctx.Err()
		}
	}
	b.mu.Unlock()
	<-op.done // already sent: its pipeline's own timeout bounds the wait
	return op.err
}

// drain sends batches until the queue is empty.
func (b *opBatcher) drain() {
	for {
		b.mu.Lock()
		batch := b.takeLocked()
		b.mu.Unlock()
		b.sendAll(batch)
		if !b.next() {
			return
		}
	}
}

// takeLocked removes the next batch from the queue (b.mu held).
func (b *opBatcher) takeLocked() []*presenceOp {
	n := min(len(b.queue), opsBatchMax)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	return batch
}

// next is called after a batch was sent: with ops still queued, a drain
// goroutine takes them on (its caller's pipeline slot passes to it) and
// next reports true; otherwise the slot is freed.
func (b *opBatcher) next() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.inFlight--
		return false
	}
	return true
}

func (b *opBatcher) sendAll(batch []*presenceOp) {
	if len(batch) == 0 {
		return
	}
	b.send(batch)
	for _, op := range batch {
		close(op.done)
	}
}

// send runs batch as one pipeline: every op's script, then one index
// update per kind. A refused connect takes its index entry back afterwards.
// The disconnects' index update also lists each of their users' offline
// check (offlineMember), before anyone knows whether the user has a live
// connection left: the check is scheduled from the reply, and the instance
// may die right after it. The members of users who are still live go
// afterwards.
func (b *opBatcher) send(batch []*presenceOp) {
	p := b.p
	ctx, cancel := context.WithTimeout(context.Background(), opsTimeout)
	defer cancel()
	var added, removed, leaving []string
	for _, op := range batch {
		if op.kind == opConnect {
			added = append(added, indexMember(op.conn))
		} else {
			removed = append(removed, indexMember(op.conn))
			if !slices.Contains(leaving, op.conn.UserID) {
				leaving = append(leaving, op.conn.UserID)
			}
		}
	}
	cmds, err := p.pipelined(ctx, func(pipe redis.Pipeliner) {
		for _, op := range batch {
			if op.kind == opConnect {
				p.heartbeat(ctx, pipe, op.conn, false)
			} else {
				p.disconnect(ctx, pipe, op.conn.UserID, op.conn.ConnID, true)
			}
		}
		if len(added) > 0 {
			p.instanceHeartbeat(ctx, pipe, added)
		}
		if len(removed) > 0 {
			p.listOffline(ctx, pipe, leaving, removed)
		}
	})
	// Each op is answered by its own script and by the index update of its
	// kind (the pipeline's error is only the first failed command's: one
	// user's failing script must not fail the others).
	addErr, removeErr, score := p.indexReplies(cmds[min(len(batch), len(cmds)):], len(added) > 0, len(removed) > 0, err)
	var refused []string
	live := map[string]bool{} // users of answered disconnects: false once one left none live
	for i, op := range batch {
		if i >= len(cmds) {
			op.err = fmt.Errorf("presence: no reply: %w", rds.ClassifyRedisError(err))
			continue
		}
		op.reply, op.err = lua.Reply(cmds[i]).Slice()
		if op.err == nil {
			// The connection's own script ran; the index update of the
			// batch must have too.
			if op.kind == opConnect {
				op.err = addErr
			} else {
				op.err = removeErr
			}
		}
		if op.err != nil {
			op.err = rds.ClassifyRedisError(op.err)
			continue
		}
		if op.kind == opConnect && len(op.reply) >= 4 {
			if r, _ := op.reply[3].(int64); r == 1 {
				refused = append(refused, indexMember(op.conn))
			}
		}
		if op.kind == opDisconnect {
			op.score = score
			n, _, ok := removalReply(op.reply)
			still, seen := live[op.conn.UserID]
			live[op.conn.UserID] = (still || !seen) && ok && n > 0
		}
	}
	p.unlistLive(live, score)
	if len(refused) > 0 {
		if err := p.rdb.ZRem(ctx, InstanceConnsKey(p.cfg.InstanceID), toAny(refused)...).Err(); err != nil {
			p.logger.Warn("presence: removing refused connections' index entries failed", slog.String("kind", rds.Kind(err)))
		}
	}
}

// indexReplies reads the replies to a batch's index updates (idx, those
// after the ops' own scripts; err, the pipeline's): the connects' error,
// the disconnects' and the score with which the latter listed their users'
// offline checks.
func (p *Presence) indexReplies(idx []redis.Cmder, added, removed bool, err error) (addErr, removeErr error, score int64) {
	if len(idx) == 0 && err == nil {
		return nil, nil, 0
	}
	if added {
		if len(idx) > 0 {
			p.noteMarker(idx[0])
		}
		addErr = pipelineErr(idx, 0, err)
		idx = idx[min(1, len(idx)):]
	}
	if removed {
		removeErr = pipelineErr(idx, 0, err)
		if removeErr == nil {
			score, removeErr = lua.Reply(idx[0]).Int64()
		}
	}
	return addErr, removeErr, score
}

// unlistLive removes the offline check members a batch of disconnects
// listed for users who still have a live connection (live[user]), unless
// a check of theirs is pending (it takes the member over).
func (p *Presence) unlistLive(live map[string]bool, score int64) {
	var users []string
	for u, l := range live {
		if l {
			users = append(users, u)
		}
	}
	if len(users) > 0 {
		p.adopt(users, score)
	}
}

// pipelineErr is the error of cmds[i], or, when the pipeline returned no
// such command, the pipeline's error.
func pipelineErr(cmds []redis.Cmder, i int, err error) error {
	if i < len(cmds) {
		return cmds[i].Err()
	}
	return err
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
