package restapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/restapi"
)

// A dialog title is shown to every member: Unicode format characters
// (bidi overrides and isolates, zero-width characters, BOM), which reorder
// or hide text where it is rendered, are refused as in attachment names.
func TestDialogTitleRefusesFormatCharacters(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	for _, title := range []string{
		"Support \u202eKCABLLAC\u202c", // RIGHT-TO-LEFT OVERRIDE
		"admin\u2066team\u2069",        // isolates
		"pay\u200bpal",                 // zero-width space
		"\ufeffbank",                   // BOM
	} {
		body := fmt.Sprintf(`{"memberIds":[%q],"title":%q}`, bob, title)
		code, b := h.do(aTok, "POST", "/v1/dialogs", body)
		if code != 400 || string(b) != `{"error":"invalid_title"}` {
			t.Errorf("title %+q: %d %s, want 400 invalid_title", title, code, b)
		}
	}
}

// A title with control characters is refused wherever they sit: at its
// ends they used to be trimmed away and the title accepted.
func TestDialogTitleControlsAtItsEndsAreRefused(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, _ := h.user()
	body := fmt.Sprintf(`{"memberIds":[%q],"title":"\n\tx\r\u000b"}`, bob)
	code, b := h.do(aTok, "POST", "/v1/dialogs", body)
	if code != 400 {
		t.Errorf("title with control characters at its ends: %d %s, want 400 invalid_title", code, b)
	}
}

// memberIds names 1 to 99 other users: a list of only the creator (once or
// repeated) is refused.
func TestDialogOfTheCreatorAloneIsRefused(t *testing.T) {
	h := newHarness(t)
	me, aTok := h.user()
	code, b := h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q,%q]}`, me, me))
	if code != 400 {
		t.Errorf("dialog of the creator alone: %d %s, want 400 invalid_members", code, b)
	}
}

// Concurrent creates with one Idempotency-Key and two different bodies:
// at most one dialog is written, every 201 answers the same dialog with
// the body its fingerprint matches, the rest are 409.
func TestConcurrentDialogCreatesWithOneKeyAndTwoBodies(t *testing.T) {
	h := newHarness(t)
	me, aTok := h.user()
	bob, _ := h.user()
	carol, _ := h.user()
	key := keyHdr("dlg-" + ids.New())
	bodies := []string{
		fmt.Sprintf(`{"memberIds":[%q],"title":"A"}`, bob),
		fmt.Sprintf(`{"memberIds":[%q],"title":"B"}`, carol),
	}
	type res struct {
		i    int
		code int
		b    []byte
	}
	out := make(chan res, 40)
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			code, b, _ := h.doH(aTok, "POST", "/v1/dialogs", bodies[i%2], key)
			out <- res{i % 2, code, b}
		}(i)
	}
	wg.Wait()
	close(out)
	ids := map[string]bool{}
	for r := range out {
		switch r.code {
		case 201:
			d := decode[dialogResp](t, r.b)
			ids[d.ID] = true
			want := []string{"A", "B"}[r.i]
			if d.Title != want {
				t.Errorf("body %d answered with a dialog titled %q", r.i, d.Title)
			}
		case 409:
		default:
			t.Errorf("unexpected %d %s", r.code, r.b)
		}
	}
	var n int
	if err := h.pool.QueryRow(context.Background(), "SELECT count(*) FROM dialogs WHERE created_by=$1", me).Scan(&n); err != nil || n != 1 {
		t.Fatalf("dialogs written: %d (%v)", n, err)
	}
	if len(ids) != 1 {
		t.Fatalf("answered dialogs: %v", ids)
	}
}

// Member lists: duplicates, the creator listed, the bound on entries, 10,000
// ids (refused before any work), a 1 MB title.
func TestDialogMemberBounds(t *testing.T) {
	h := newHarness(t)
	me, aTok := h.user()
	bob, _ := h.user()
	dup := make([]string, 1000) // the bound on entries (docs/api.md)
	for i := range dup {
		dup[i] = bob
	}
	code, b := h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":["%s"]}`, strings.Join(dup, `","`)))
	if code != 201 {
		t.Fatalf("%d copies of bob: %d %s", len(dup), code, b)
	}
	if d := decode[dialogResp](t, b); len(d.MemberIDs) != 2 || d.MemberIDs[0] != me || d.MemberIDs[1] != bob {
		t.Fatalf("members: %s", b)
	}
	// One entry past the bound on entries, though still two members.
	code, b = h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":["%s","%s"]}`, strings.Join(dup, `","`), bob))
	wantError(t, code, b, 400, "invalid_members")
	many := make([]string, 10000)
	for i := range many {
		many[i] = ids.New()
	}
	code, b = h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":["%s"]}`, strings.Join(many, `","`)))
	wantError(t, code, b, 413, "payload_too_large")
	code, b = h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q],"title":"%s"}`, bob, strings.Repeat("x", 1<<20)))
	wantError(t, code, b, 413, "payload_too_large")
	code, b = h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q],"title":"a\u0000b"}`, bob))
	wantError(t, code, b, 400, "invalid_title")
	code, b = h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf("{\"memberIds\":[%q],\"title\":\"a\xffb\"}", bob))
	wantError(t, code, b, 400, "invalid_json")
	code, b = h.do(aTok, "POST", "/v1/dialogs", `{"memberIds":[null]}`)
	wantError(t, code, b, 400, "invalid_members")
	code, b = h.do(aTok, "POST", "/v1/dialogs", `{"memberIds":["00000000-0000-0000-0000-000000000000"]}`)
	wantError(t, code, b, 404, "user_not_found")
}

// Listing: limits, other users' cursors, garbage.
func TestDialogListingCursorsAndLimitsAtTheEdges(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	bob, bTok := h.user()
	carol, _ := h.user()
	mine := map[string]bool{}
	for i := 0; i < 3; i++ {
		mine[h.dialog(aTok, carol).ID] = true
	}
	for i := 0; i < 3; i++ {
		h.dialog(bTok, carol)
	}
	_ = bob
	for _, l := range []string{"0", "-1", "101", "99999999999999999999", "1.5", "1e2", "%205", "0x10", ""} {
		code, b := h.do(aTok, "GET", "/v1/dialogs?limit="+l, "")
		if l == "" {
			if code != 200 {
				t.Errorf("no limit: %d %s", code, b)
			}
			continue
		}
		if code != 400 || string(b) != `{"error":"invalid_limit"}` {
			t.Errorf("limit=%s: %d %s", l, code, b)
		}
	}
	// Bob's cursor in Alice's listing: a position only.
	_, b := h.do(bTok, "GET", "/v1/dialogs?limit=1", "")
	bl := decode[listResp[dialogResp]](t, b)
	if bl.NextCursor == nil {
		t.Fatal("bob has more than one dialog")
	}
	code, b := h.do(aTok, "GET", "/v1/dialogs?limit=100&cursor="+*bl.NextCursor, "")
	if code != 200 {
		t.Fatalf("bob's cursor: %d %s", code, b)
	}
	for _, d := range decode[listResp[dialogResp]](t, b).Items {
		if !mine[d.ID] {
			t.Errorf("alice sees %s through bob's cursor", d.ID)
		}
	}
	for _, c := range []string{
		"abc=", "!!!!", strings.Repeat("A", 8000), base64.StdEncoding.EncodeToString([]byte("1:" + ids.New())),
		base64.RawURLEncoding.EncodeToString([]byte("1700000000000000:" + ids.New() + ":x")),
		base64.RawURLEncoding.EncodeToString([]byte(" 1700000000000000:" + ids.New())),
		base64.RawURLEncoding.EncodeToString([]byte("1700000000000000")),
	} {
		code, b := h.do(aTok, "GET", "/v1/dialogs?cursor="+c, "")
		if code != 400 || string(b) != `{"error":"invalid_cursor"}` {
			t.Errorf("cursor %.40q: %d %s", c, code, b)
		}
	}
	// A cursor at the start of time / end of time: valid, empty / full.
	for _, us := range []string{"-62135596800000000", "253402300799999999"} {
		c := base64.RawURLEncoding.EncodeToString([]byte(us + ":" + ids.New()))
		if code, b := h.do(aTok, "GET", "/v1/dialogs?cursor="+c, ""); code != 200 {
			t.Errorf("cursor at %s: %d %s", us, code, b)
		}
	}
}

// First sight: many concurrent first requests of one new user, then that
// user is a member candidate at once.
func TestManyFirstRequestsOfANewUserAtOnce(t *testing.T) {
	h := newHarness(t)
	_, aTok := h.user()
	for round := 0; round < 5; round++ {
		id := ids.New()
		tok, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: strings.ToUpper(id), Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan string, 20)
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, b := h.do(tok, "GET", "/v1/me", "")
				if code != 200 || string(b) != `{"id":"`+id+`"}` {
					errs <- fmt.Sprintf("%d %s", code, b)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("first sight: %s", e)
		}
		h.dialog(aTok, strings.ToUpper(id))
	}
}

// The member bound counts the dialog's members, the creator included, as
// /v1/public/config's dialogMembersMax says: the creator listed beside 99
// others makes a dialog of 100 and is accepted like the same 99 without the
// creator; 100 others (101 members) are refused, listed once or with
// repeats and the creator.
func TestDialogMemberBoundCountsMembersNotEntries(t *testing.T) {
	h := newHarness(t)
	me, tok := h.user()
	_, cfg := h.do("", "GET", "/v1/public/config", "")
	var pc struct {
		Limits struct {
			DialogMembersMax int `json:"dialogMembersMax"`
		} `json:"limits"`
	}
	if err := json.Unmarshal(cfg, &pc); err != nil || pc.Limits.DialogMembersMax != restapi.MaxDialogMembers {
		t.Fatalf("public config: %s (%v)", cfg, err)
	}
	maxMembers := pc.Limits.DialogMembersMax
	others := make([]string, maxMembers)
	for i := range others {
		others[i], _ = h.user()
	}
	create := func(list []string) (int, []byte) {
		return h.do(tok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":["%s"]}`, strings.Join(list, `","`)))
	}
	most := others[:maxMembers-1]
	for name, list := range map[string][]string{
		"99 others":                             most,
		"the creator and 99 others":             append([]string{me}, most...),
		"99 others, repeated, with the creator": append(append(slices.Clone(most), most...), me, me),
	} {
		code, b := create(list)
		if code != 201 {
			t.Errorf("%s (%d members with the creator): %d %s", name, maxMembers, code, b)
			continue
		}
		if d := decode[dialogResp](t, b); len(d.MemberIDs) != maxMembers {
			t.Errorf("%s: %d members", name, len(d.MemberIDs))
		}
	}
	for name, list := range map[string][]string{
		"100 others":                 others,
		"100 others and the creator": append([]string{me}, others...),
		"100 others, the last twice": append(slices.Clone(others), others[len(others)-1]),
	} {
		if code, b := create(list); code != 400 || string(b) != `{"error":"invalid_members"}` {
			t.Errorf("%s: %d %s, want 400 invalid_members", name, code, b)
		}
	}
}
