package restapi_test

import (
	"fmt"
	"slices"
	"testing"
)

// A dialog's memberIds read the same in its creation's answer and in every
// member's listing: the creator first, then the others by id. All members
// join at the same instant, so a listing in join order put the creator
// wherever its id sorted.
func TestDialogMembersReadInOneOrder(t *testing.T) {
	h := newHarness(t)
	bob, bTok := h.user()
	carol, _ := h.user()
	alice, aTok := h.user() // the newest id (UUIDv7): it sorts after bob and carol
	_, b := h.do(aTok, "POST", "/v1/dialogs", fmt.Sprintf(`{"memberIds":[%q,%q]}`, carol, bob))
	d := decode[dialogResp](t, b)
	others := []string{bob, carol}
	slices.Sort(others)
	if want := append([]string{alice}, others...); !slices.Equal(d.MemberIDs, want) {
		t.Fatalf("create answered memberIds %v, want the creator first, then by id: %v", d.MemberIDs, want)
	}
	for who, tok := range map[string]string{"creator": aTok, "member": bTok} {
		_, b := h.do(tok, "GET", "/v1/dialogs?limit=1", "")
		l := decode[listResp[dialogResp]](t, b)
		if len(l.Items) != 1 || l.Items[0].ID != d.ID {
			t.Fatalf("%s's listing: %s", who, b)
		}
		if !slices.Equal(l.Items[0].MemberIDs, d.MemberIDs) {
			t.Errorf("%s's listing has memberIds %v, the create answered %v", who, l.Items[0].MemberIDs, d.MemberIDs)
		}
	}
}
