package restapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/legacystub"
	"github.com/han-app/gateway/store"
)

// The legacy DB2 safety stub (docs/legacy-stub.md).
// Only while Deps.LegacyStub is set: a message send records a safety task
// in its transaction and writes it into DB2 after the commit, the send
// response (and its idempotent replays) carries safety:"pending", and
// GET /v1/messages/{id}/safety polls the task. With the stub off none of
// this exists: the message DTO is exactly that of docs/api.md and the route
// is 404.

var errMessageNotFound = apiErr(http.StatusNotFound, "message_not_found")

// safetyDTO answers GET /v1/messages/{id}/safety.
type safetyDTO struct {
	MessageID string `json:"messageId"`
	Safety    string `json:"safety"` // pending, approved or rejected
}

func (s *Server) safetyRoutes(user *mux.Router) {
	if s.stub == nil {
		return
	}
	user.HandleFunc("/messages/{id}/safety", s.handle(s.messageSafety)).Methods(readMethods...)
}

// startSafetyTask writes a new message's task into DB2 after the commit.
func (s *Server) startSafetyTask(ctx context.Context, messageID string) {
	if s.stub != nil {
		s.stub.Start(ctx, messageID)
	}
}

// sentMessageDTO is the message DTO a send answers. With the stub on it
// carries safety:"pending" when the message has a task — the state at
// creation, so a replay answers the same bytes; the verdict is read from the
// safety endpoint. fresh is true for a message this request created (its
// task was inserted in the same transaction).
func (s *Server) sentMessageDTO(ctx context.Context, m store.Message, fresh bool) (MessageDTO, error) {
	dto := ToMessageDTO(m)
	if s.stub == nil {
		return dto, nil
	}
	has := fresh
	if !fresh {
		var err error
		if has, err = s.stub.HasTask(ctx, m.ID); err != nil {
			return dto, err
		}
	}
	if has {
		dto.Safety = legacystub.SafetyPending
	}
	return dto, nil
}

// messageSafety polls a message's safety task: members of the message's
// dialog only (anyone else gets 404 message_not_found, as for a message that
// does not exist).
func (s *Server) messageSafety(w http.ResponseWriter, r *http.Request) error {
	id, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	ctx := r.Context()
	m, err := s.store.GetMessage(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return errMessageNotFound
	}
	if err != nil {
		return err
	}
	member, err := s.store.IsMember(ctx, m.DialogID, principal(r).UserID)
	if err != nil {
		return err
	}
	if !member {
		return errMessageNotFound
	}
	state, err := s.stub.Poll(ctx, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, safetyDTO{MessageID: id, Safety: state})
	return nil
}
