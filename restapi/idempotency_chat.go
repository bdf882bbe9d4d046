package restapi

import (
	"context"
	"errors"
	"net/http"
	"sort"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// validateAttachmentIDs checks attachmentIds: at most 10 distinct UUIDs
// (400 invalid_attachment otherwise). Whether each one is an uploaded,
// unlinked attachment of the dialog is checked in the send transaction.
func validateAttachmentIDs(in *[]string) ([]string, error) {
	if in == nil || len(*in) == 0 {
		return nil, nil
	}
	if len(*in) > store.MaxMessageAttachments {
		return nil, errInvalidAttachment
	}
	out := make([]string, 0, len(*in))
	seen := map[string]bool{}
	for _, v := range *in {
		id, ok := ids.Canonical(v)
		if !ok || seen[id] {
			return nil, errInvalidAttachment
		}
		seen[id] = true
		out = append(out, id)
	}
	return out, nil
}

// canonicalSend is the validated send request, re-encoded for the
// fingerprint (the dialog id is part of the fingerprint through the path).
type canonicalSend struct {
	Body            string   `json:"body"`
	ClientMessageID string   `json:"clientMessageId"`
	AttachmentIDs   []string `json:"attachmentIds"`
}

// sendMessageIdempotent runs a validated send under its Idempotency-Key
// (required). The record keeps the message id and seq; a replay re-reads
// the message.
func (s *Server) sendMessageIdempotent(w http.ResponseWriter, r *http.Request, in store.SendMessage) {
	canon, _ := json.Marshal(canonicalSend{Body: in.Body, ClientMessageID: in.ClientMessageID, AttachmentIDs: in.AttachmentIDs})
	s.serveIdempotent(w, r, idemOp{
		scope: scopeMessageSend, required: true, canon: canon,
		exec: func(ctx context.Context, target *idemTarget) (idemResult, error) {
			in := in
			in.ID = ids.New()
			in.Idem = idemWrite(target, func(m store.Message) store.IdemRecord {
				return store.IdemRecord{Status: http.StatusCreated, ResourceID: m.ID, Version: m.Seq}
			})
			in.SafetyTask = s.stub != nil
			if knownOutsider(ctx) {
				// The limiter found the sender is no member (of a
				// dialog whose limit is used up): answered as the
				// statement would answer it, without running it.
				return idemResult{}, s.keyAnswers(ctx, target, store.ErrDialogNotFound)
			}
			m, ev, created, err := s.store.SendMessage(ctx, in)
			sendOutcome(ctx, err, created)
			if err != nil {
				return idemResult{}, s.keyAnswers(ctx, target, err)
			}
			// A repeated clientMessageId (created false) answers the
			// message it repeats, and the statement records the key for
			// it as for a created one: a live record of the key (Redis
			// lost it) came back as ErrIdemExists instead, which answers
			// from that record (a replay of the same request, 409 for
			// another one).
			dto, err := s.sentMessageDTO(ctx, m, created)
			if err != nil {
				return idemResult{}, err
			}
			body, err := json.Marshal(dto)
			res := idemResult{rec: store.IdemRecord{Status: http.StatusCreated, ResourceID: m.ID, Version: m.Seq}, body: body}
			if created {
				res.after = func() { s.publishAfterCommit(ctx, ev); s.startSafetyTask(ctx, m.ID) }
			}
			return res, err
		},
		render: func(ctx context.Context, rec store.IdemRecord) ([]byte, error) {
			m, err := s.store.GetMessage(ctx, rec.ResourceID)
			if err != nil {
				return nil, err
			}
			dto, err := s.sentMessageDTO(ctx, m, false)
			if err != nil {
				return nil, err
			}
			return json.Marshal(dto)
		},
	})
}

// keyAnswers is the error of a keyed send or attachment init whose own
// checks failed: the checks (membership, attachments) run before the key's
// record is looked at, and a retry of a request that committed fails them
// (a send's attachments are linked now, the sender or uploader may have
// left the dialog since). When PostgreSQL holds a live record of the key
// (Redis lost it, or the first attempt's answer was lost after its commit),
// that record answers instead (ErrIdemExists): the replay of the same
// request, or 409 for another. A lookup that fails answers its own error
// (503): the check's 4xx would tell the client, for good, that nothing was
// written, and the request's effect may have been.
func (s *Server) keyAnswers(ctx context.Context, target *idemTarget, err error) error {
	if target == nil || !(errors.Is(err, store.ErrInvalidAttachment) || errors.Is(err, store.ErrDialogNotFound)) {
		return err
	}
	_, found, lerr := s.store.LookupIdempotency(ctx, target.key)
	switch {
	case lerr != nil:
		return lerr
	case found:
		return store.ErrIdemExists
	}
	return err
}

// canonicalDialog is the validated dialog-create request.
type canonicalDialog struct {
	MemberIDs []string `json:"memberIds"`
	Title     string   `json:"title"`
}

// createDialogIdempotent creates a dialog; the Idempotency-Key is optional
// here (it is required only on message send and attachment init). The
// record keeps the dialog id; a replay re-reads the dialog and answers it as
// it was created (lastSeq 0).
func (s *Server) createDialogIdempotent(w http.ResponseWriter, r *http.Request, me, title string, members []string) {
	canon, _ := json.Marshal(canonicalDialog{MemberIDs: members, Title: title})
	s.serveIdempotent(w, r, idemOp{
		scope: scopeDialogCreate, canon: canon,
		exec: func(ctx context.Context, target *idemTarget) (idemResult, error) {
			idem := idemWrite(target, func(d store.Dialog) store.IdemRecord {
				return store.IdemRecord{Status: http.StatusCreated, ResourceID: d.ID}
			})
			d, err := s.store.CreateDialog(ctx, ids.New(), me, title, members, idem)
			if err != nil {
				return idemResult{}, err
			}
			body, err := json.Marshal(createdDialogDTO(d, me))
			return idemResult{rec: store.IdemRecord{Status: http.StatusCreated, ResourceID: d.ID}, body: body}, err
		},
		render: func(ctx context.Context, rec store.IdemRecord) ([]byte, error) {
			d, err := s.store.DialogForMember(ctx, rec.ResourceID, me)
			if err != nil {
				return nil, err
			}
			d.LastSeq = rec.Version
			return json.Marshal(createdDialogDTO(d, me))
		},
	})
}

// createdDialogDTO is the dialog as its creation answers it: the creator
// first, then the other members by id, so a replay that re-reads the dialog
// produces the same bytes.
func createdDialogDTO(d store.Dialog, creator string) dialogDTO {
	members := make([]string, 0, len(d.MemberIDs))
	members = append(members, creator)
	for _, m := range d.MemberIDs {
		if m != creator {
			members = append(members, m)
		}
	}
	sort.Strings(members[1:])
	d.MemberIDs = members
	return toDialogDTO(d)
}
