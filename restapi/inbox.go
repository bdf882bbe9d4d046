package restapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"

	"github.com/gorilla/mux"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// Inbox limits.
const (
	MaxInboxIDLen     = 128
	MaxInboxKindLen   = 64
	MaxInboxDataBytes = 16 << 10
	// InboxEventPrefix prefixes the realtime event name of an inbox item
	// ("inbox.<kind>"), so a service cannot impersonate the chat's own
	// events such as message.created.
	InboxEventPrefix = "inbox."
)

// internalRoutes registers /v1/internal for service tokens. It must be
// registered before the /v1 user subrouter, which matches the whole /v1
// prefix and refuses service tokens.
func (s *Server) internalRoutes(r *mux.Router) {
	internal := r.PathPrefix("/v1/internal").Subrouter()
	internal.Use(s.authenticate(false))
	internal.Use(s.rateLimit)
	internal.HandleFunc("/inbox", s.handle(s.acceptInbox)).Methods(http.MethodPost)
}

type inboxReq struct {
	ID       *string         `json:"id"`
	Kind     *string         `json:"kind"`
	DialogID *string         `json:"dialogId"`
	UserID   *string         `json:"userId"`
	Data     json.RawMessage `json:"data"`
}

type inboxReceiptDTO struct {
	ID         string `json:"id"`
	Service    string `json:"service"`
	Kind       string `json:"kind"`
	DialogID   string `json:"dialogId,omitempty"`
	UserID     string `json:"userId,omitempty"`
	EventID    string `json:"eventId"`
	ReceivedAt int64  `json:"receivedAt"`
}

func inboxToken(s string, max int, allowUpper bool) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		case allowUpper && (c >= 'A' && c <= 'Z' || c == ':'):
		default:
			return false
		}
	}
	return true
}

// acceptInbox: POST /v1/internal/inbox {id, kind, dialogId | userId, data}
// from a service. The receipt is durable in PostgreSQL and idempotent by
// (service, id): 201 the first time, 200 with the same receipt after. The
// realtime event is written to the outbox in the same transaction and
// published after commit; with Redis down the request still succeeds and
// the event waits in the outbox for the relay.
func (s *Server) acceptInbox(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	if p.Service == "" {
		return errForbidden
	}
	var req inboxReq
	if err := decodeJSON(w, r, ChatBodyLimit, &req); err != nil {
		return err
	}
	if req.ID == nil || !inboxToken(*req.ID, MaxInboxIDLen, true) {
		return apiErr(http.StatusBadRequest, "invalid_id")
	}
	if req.Kind == nil || !inboxToken(*req.Kind, MaxInboxKindLen, false) {
		return apiErr(http.StatusBadRequest, "invalid_kind")
	}
	item := store.InboxItem{Service: p.Service, ID: *req.ID, Kind: *req.Kind}
	var target string
	switch {
	case req.DialogID != nil && req.UserID == nil:
		id, ok := ids.Canonical(*req.DialogID)
		if !ok {
			return apiErr(http.StatusBadRequest, "invalid_target")
		}
		item.DialogID, target = id, "dialog:"+id
	case req.UserID != nil && req.DialogID == nil:
		id, ok := ids.Canonical(*req.UserID)
		if !ok {
			return apiErr(http.StatusBadRequest, "invalid_target")
		}
		item.UserID, target = id, "user:"+id
	default:
		return apiErr(http.StatusBadRequest, "invalid_target")
	}
	// data: a JSON object (already strictly checked with the whole body).
	var data bytes.Buffer
	if len(req.Data) == 0 || req.Data[0] != '{' || json.Compact(&data, req.Data) != nil || data.Len() > MaxInboxDataBytes {
		return apiErr(http.StatusBadRequest, "invalid_data")
	}
	sum := sha256.Sum256([]byte(item.Kind + "\n" + target + "\n" + data.String()))
	item.Fingerprint = hex.EncodeToString(sum[:])
	item.EventID = ids.New()
	payload := data.Bytes()
	item.Event = func(rc store.InboxReceipt) (store.OutboxEvent, error) {
		ev := pubsub.Event{Type: "event", ID: rc.EventID, Event: InboxEventPrefix + rc.Kind, EntityID: rc.ID, Data: payload}
		channel := ""
		if rc.DialogID != "" {
			ev.Channel, ev.DialogID, channel = "dialog:"+rc.DialogID, rc.DialogID, pubsub.DialogChannel(rc.DialogID)
		} else {
			ev.Channel, channel = "user:"+rc.UserID, pubsub.UserChannel(rc.UserID)
		}
		b, err := ev.Encode()
		if err != nil {
			return store.OutboxEvent{}, err
		}
		return store.OutboxEvent{EventID: rc.EventID, Channel: channel, EntityID: rc.ID, Payload: b}, nil
	}
	rc, ev, created, err := s.store.AcceptInbox(r.Context(), item)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		s.publishAfterCommit(r.Context(), ev)
		status = http.StatusCreated
	}
	writeJSON(w, status, inboxReceiptDTO{ID: rc.ID, Service: rc.Service, Kind: rc.Kind, DialogID: rc.DialogID,
		UserID: rc.UserID, EventID: rc.EventID, ReceivedAt: rc.ReceivedAt.UnixMilli()})
	return nil
}
