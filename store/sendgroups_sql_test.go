package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/han-app/gateway/internal/ids"
)

// send_groups remembers, within one call, only what the messages before the
// current one created or recorded: a clientMessageId repeats the first
// created message with it in its dialog (not a refused one, not the same id
// in another dialog), an idempotency key is used once a message recorded
// it, and an attachment is taken once a created message links it (the same
// attachment twice in one message is refused, and a refused message takes
// nothing).
func TestSendGroupsRemembersOnlyWhatEarlierMessagesCreated(t *testing.T) {
	s, pool := openStore(t)
	ctx := context.Background()
	f := newSendFixture(t, s, 2)
	alice := f.users[1]
	other, err := s.CreateDialog(ctx, ids.New(), f.users[0], "other", f.users[1:])
	if err != nil {
		t.Fatal(err)
	}
	att, att2 := uploadedAttachment(t, s, f.dialog, alice), uploadedAttachment(t, s, f.dialog, alice)
	k1, k2, k3 := ids.New(), ids.New(), ids.New()
	type msg struct {
		dialog int32
		cmid   string
		atts   []string
		key    string
	}
	msgs := []msg{
		{1, "x", []string{att}, k1},       // 1 created, seq 1, links att
		{1, "y", []string{att}, k2},       // 2 att taken by 1: refused before recording k2
		{1, "y", nil, k2},                 // 3 created, seq 2: the first created "y"
		{1, "y", nil, k3},                 // 4 repeats 3, records k3 naming it
		{1, "", nil, k1},                  // 5 k1 recorded by 1
		{1, "x", nil, ""},                 // 6 repeats 1
		{2, "x", nil, ""},                 // 7 "x" in the other dialog: created, seq 1 there
		{1, "", []string{att2, att2}, ""}, // 8 the same attachment twice
		{1, "", []string{att2}, k3},       // 9 k3 recorded by 4
		{1, "", []string{att2}, ""},       // 10 created, seq 3: 8 and 9 took nothing
	}
	var (
		dialogIdx, attCounts, statuses                 []int32
		msgIDs, senders, bodies, cmids, attIDs, events []string
		scopes, keys, fps, metas                       []string
		safety                                         []bool
		ttls                                           []int64
	)
	for i, m := range msgs {
		dialogIdx, msgIDs, senders = append(dialogIdx, m.dialog), append(msgIDs, ids.New()), append(senders, alice)
		bodies, cmids, events = append(bodies, fmt.Sprint("m", i+1)), append(cmids, m.cmid), append(events, "")
		attCounts, attIDs, safety = append(attCounts, int32(len(m.atts))), append(attIDs, m.atts...), append(safety, false)
		scope := ""
		if m.key != "" {
			scope = "msg_send"
		}
		scopes, keys, fps = append(scopes, scope), append(keys, m.key), append(fps, "fp")
		statuses, metas, ttls = append(statuses, 201), append(metas, "{}"), append(ttls, 3600000)
	}
	rows, err := pool.Query(ctx, `SELECT r_ord, r_outcome, r_ref, r_seq, r_id FROM send_groups($1::text[]::uuid[], $2::text[], 1000, $3::int[],
		$4::text[]::uuid[], $5::text[]::uuid[], $6::text[], $7::text[], $8::int[], $9::text[]::uuid[], $10::text[], $11::boolean[],
		$12::text[], $13::text[], $14::text[], $15::int[], $16::text[], $17::bigint[]) ORDER BY r_ord`,
		[]string{f.dialog, other.ID}, []string{"a", "b"}, dialogIdx, msgIDs, senders, bodies, cmids, attCounts, attIDs, events, safety,
		scopes, keys, fps, statuses, metas, ttls)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var ord, ref int32
		var outcome, id string
		var seq int64
		if err := rows.Scan(&ord, &outcome, &ref, &seq, &id); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d:%s:%d:%d", ord, outcome, seq, ref))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := "1:created:1:0 2:invalid_attachment:0:0 3:created:2:0 4:duplicate:0:3 5:idem_exists:0:0 6:duplicate:0:1 " +
		"7:created:1:0 8:invalid_attachment:0:0 9:idem_exists:0:0 10:created:3:0"
	if g := strings.Join(got, " "); g != want {
		t.Fatalf("send_groups answered\n%s\nwant\n%s", g, want)
	}
	checkGapless(t, s, f.dialog, 3, nil)
	checkGapless(t, s, other.ID, 1, nil)
	for _, c := range []struct{ att, msg string }{{att, msgIDs[0]}, {att2, msgIDs[9]}} {
		a, err := s.GetAttachment(ctx, c.att)
		if err != nil || a.MessageID != c.msg {
			t.Fatalf("attachment %s linked to %q, want %s (%v)", c.att, a.MessageID, c.msg, err)
		}
	}
	for key, msg := range map[string]string{k1: msgIDs[0], k2: msgIDs[2], k3: msgIDs[2]} {
		var resource string
		if err := pool.QueryRow(ctx, "SELECT resource_id FROM idempotency_records WHERE key_hmac = $1", key).Scan(&resource); err != nil || resource != msg {
			t.Fatalf("the record of key %s names %q, want %s (%v)", key, resource, msg, err)
		}
	}
}
