package gateway

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Handshakes beyond the slots wait in arrival order; one that finds the
// queue full is refused at once, without waiting.
func TestAdmissionQueuesInOrderAndRefusesWhenFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAdmission(2, 3, time.Minute)
		for range 2 {
			if err := a.acquire(nil); err != nil {
				t.Fatalf("free slot: %v", err)
			}
		}
		var (
			mu    sync.Mutex
			order []int
		)
		for i := range 3 {
			go func() {
				if err := a.acquire(nil); err != nil {
					t.Errorf("queued handshake %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
			}()
			synctest.Wait() // queued before the next one arrives
		}
		if st := a.stats(); st.active != 2 || st.queued != 3 || st.queuedMax != 3 {
			t.Fatalf("stats %+v, want 2 active and 3 queued", st)
		}
		start := time.Now()
		if err := a.acquire(nil); !errors.Is(err, errAdmissionFull) {
			t.Fatalf("acquire with a full queue: %v, want errAdmissionFull", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("a refusal for a full queue waited %v", waited)
		}
		for range 3 {
			a.release()
			synctest.Wait()
		}
		if len(order) != 3 || order[0] != 0 || order[1] != 1 || order[2] != 2 {
			t.Fatalf("admitted in order %v, want [0 1 2]", order)
		}
		if st := a.stats(); st.active != 2 || st.queued != 0 || st.waits != 3 || st.refusedFull != 1 {
			t.Fatalf("stats %+v, want 2 active (handed over), 3 waits, 1 refusal", st)
		}
		a.release()
		a.release()
		if st := a.stats(); st.active != 0 {
			t.Fatalf("%d slots held after every release", st.active)
		}
	})
}

// A queued handshake is refused once its wait runs out, and leaves the
// queue: a later release frees the slot instead of handing it to it.
func TestAdmissionWaitIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAdmission(1, 10, 3*time.Second)
		if err := a.acquire(nil); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := a.acquire(nil); !errors.Is(err, errAdmissionWait) {
			t.Fatalf("acquire behind a held slot: %v, want errAdmissionWait", err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Fatalf("refused after %v, want the wait bound 3s", waited)
		}
		if st := a.stats(); st.queued != 0 || st.refusedWait != 1 || st.waits != 0 {
			t.Fatalf("stats %+v, want an empty queue and one refusal", st)
		}
		a.release()
		if st := a.stats(); st.active != 0 {
			t.Fatalf("%d slots held after the release", st.active)
		}
		if err := a.acquire(nil); err != nil {
			t.Fatalf("free slot after the release: %v", err)
		}
	})
}

// Under a storm no more handshakes than the slots run at once, and no
// more than the queue's bound wait; the rest are refused.
func TestAdmissionBoundsAStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, queue, n = 4, 50, 1000
		a := newAdmission(limit, queue, 2*time.Second)
		var (
			mu                     sync.Mutex
			running, maxRunning    int
			admitted, full, waited int
			wg                     sync.WaitGroup
		)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := a.acquire(nil)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, errAdmissionFull):
					full++
					return
				case errors.Is(err, errAdmissionWait):
					waited++
					return
				case err != nil:
					t.Errorf("acquire: %v", err)
					return
				}
				admitted++
				running++
				maxRunning = max(maxRunning, running)
				mu.Unlock()
				time.Sleep(100 * time.Millisecond) // the handshake's work
				mu.Lock()
				running--
				a.release()
			}()
		}
		wg.Wait()
		st := a.stats()
		if maxRunning > limit || st.queuedMax > queue {
			t.Fatalf("%d ran at once (limit %d), queue reached %d (bound %d)", maxRunning, limit, st.queuedMax, queue)
		}
		if admitted+full+waited != n || full < n-limit-queue || admitted < limit+queue {
			t.Fatalf("%d admitted, %d refused full, %d refused after waiting", admitted, full, waited)
		}
		if st.active != 0 || st.queued != 0 {
			t.Fatalf("stats %+v after the storm, want nothing held or queued", st)
		}
	})
}
