package restapi_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/segmentio/encoding/json"
)

// lastMessage.seq = lastSeq on every listed dialog while sends run, and a
// listing paged during concurrent creates lists every dialog that existed
// before it started exactly once.
func TestDialogListingUnderConcurrentWrites(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, bTok := h.user()
	var before []string
	for i := 0; i < 12; i++ {
		before = append(before, h.dialog(aTok, bob).ID)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				d := before[(w*5+i)%len(before)]
				h.doH(bTok, "POST", "/v1/dialogs/"+d+"/messages", fmt.Sprintf(`{"body":"m%d"}`, i), idemKey())
				if i%4 == 0 {
					h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q]}`, bob))
				}
			}
		}(w)
	}
	type item struct {
		ID          string `json:"id"`
		LastSeq     int64  `json:"lastSeq"`
		LastMessage *struct {
			Seq int64 `json:"seq"`
		} `json:"lastMessage"`
	}
	for round := 0; round < 15; round++ {
		seen := map[string]int{}
		cursor := ""
		for pages := 0; pages < 200; pages++ {
			path := "/v1/dialogs?limit=2"
			if cursor != "" {
				path += "&cursor=" + cursor
			}
			code, b := h.do(aTok, "GET", path, "")
			if code != 200 {
				t.Fatalf("listing: %d %s", code, b)
			}
			var l listResp[json.RawMessage]
			if err := json.Unmarshal(b, &l); err != nil {
				t.Fatal(err)
			}
			for _, raw := range l.Items {
				var it item
				if err := json.Unmarshal(raw, &it); err != nil {
					t.Fatal(err)
				}
				seen[it.ID]++
				if it.LastMessage != nil && it.LastMessage.Seq != it.LastSeq || it.LastMessage == nil && it.LastSeq != 0 {
					t.Errorf("dialog %s: lastSeq %d, lastMessage %s", it.ID, it.LastSeq, raw)
				}
			}
			if l.NextCursor == nil {
				break
			}
			cursor = *l.NextCursor
		}
		for _, id := range before {
			if seen[id] != 1 {
				t.Errorf("round %d: dialog %s listed %d times", round, id, seen[id])
			}
		}
	}
	stop.Store(true)
	wg.Wait()
}
