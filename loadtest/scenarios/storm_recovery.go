package scenarios

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// resubscribe subscribes the new connection wc of client c to dialog d.
// With -recover it passes sinceSeq = what the lost connection old had seen,
// so the server replays the missed events; a resync answer is read over
// REST from there. Without it, it subscribes plainly and reads the newest
// history page over REST, as a client without recovery must.
func (s *ConnectStorm) resubscribe(ctx context.Context, t *loadtest.T, fl *fleet, old, wc *loadtest.WSConn, c, d int) error {
	dialog := fl.dialogIDs[d]
	rest := t.Reg.Counter(MetricStormRESTReads)
	if !s.recover {
		lastSeq, err := wc.Subscribe(ctx, dialog)
		if err != nil || lastSeq == 0 {
			return err
		}
		rest.Inc()
		_, _, err = fl.setupAPI.History(ctx, fl.users[c], dialog, max(lastSeq-100, 0), 100)
		return err
	}
	known := old.Known(dialog)
	rec, err := wc.SubscribeSince(ctx, dialog, known)
	if err != nil {
		return err
	}
	t.Reg.Counter(MetricStormReplayed).Add(int64(rec.Replayed))
	switch {
	case rec.Resync:
		t.Reg.Counter(MetricStormResyncs).Inc()
		rest.Inc()
		_, _, err = fl.setupAPI.History(ctx, fl.users[c], dialog, known, 100)
		return err
	case !rec.Complete:
		t.Reg.Counter(MetricStormGaps).Inc()
	}
	return nil
}

// stormSender sends -send-rate messages/s into the fleet's dialogs (each
// by the dialog's first member) until stopped, and remembers the highest
// seq it got for each dialog.
type stormSender struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	api    *loadtest.API  // the -send-target client, closed by stop (nil: the setup API)
	last   []atomic.Int64 // per dialog: the highest seq a send was answered with
}

// startSender starts the sender (nil without -send-rate).
func (s *ConnectStorm) startSender(ctx context.Context, t *loadtest.T, fl *fleet) (*stormSender, error) {
	if s.sendRate == 0 {
		return nil, nil
	}
	api, own := fl.setupAPI, (*loadtest.API)(nil)
	if s.sendTarget != "" {
		var err error
		if own, err = loadtest.NewAPI(s.sendTarget, loadtest.NewHTTPClient(t.Src, 64, 10*time.Second), loadtest.NewRegistry()); err != nil {
			return nil, fmt.Errorf("-send-target: %w", err)
		}
		api = own
	}
	sctx, cancel := context.WithCancel(ctx)
	snd := &stormSender{cancel: cancel, api: own, last: make([]atomic.Int64, len(fl.dialogIDs))}
	members := fl.shape.members()
	sent, failed := t.Reg.Counter(MetricStormSent), t.Reg.Counter(MetricStormSendErrors)
	interval := time.Second / time.Duration(s.sendRate)
	snd.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			d := rand.N(len(fl.dialogIDs))
			snd.wg.Go(func() {
				sender := fl.users[members[d][0]]
				body := loadtest.ChatBody(time.Now().UnixNano(), 64)
				m, err := api.SendMessage(sctx, sender, fl.dialogIDs[d], body, fmt.Sprintf("storm-%d-%d", d, n))
				if err != nil {
					failed.Inc()
					return
				}
				sent.Inc()
				for {
					cur := snd.last[d].Load()
					if m.Seq <= cur || snd.last[d].CompareAndSwap(cur, m.Seq) {
						break
					}
				}
			})
		}
	})
	return snd, nil
}

// stop ends the sends and waits for those in flight.
func (snd *stormSender) stop() {
	snd.cancel()
	snd.wg.Wait()
	if snd.api != nil {
		snd.api.Close()
	}
}

// behind waits for the last sends' live events to arrive (up to 5 s) and
// counts the (client, dialog) pairs whose connection has not seen every seq
// up to the highest one sent: a message that neither recovery nor the live
// stream delivered.
func (snd *stormSender) behind(ctx context.Context, fl *fleet) int {
	count := func() int {
		n := 0
		for c, conn := range fl.conns {
			for _, d := range fl.shape.dialogsOf(c) {
				if conn != nil && conn.Known(fl.dialogIDs[d]) < snd.last[d].Load() {
					n++
				}
			}
		}
		return n
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := count()
		if n == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}
