package restapi

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"unicode"
	"unicode/utf8"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
)

// Chat limits (docs/api.md and docs/decisions.md).
const (
	MaxMessageChars  = 4000
	MaxTitleChars    = 200
	MaxDialogMembers = 100 // including the creator
	// maxMemberIDEntries bounds the entries of memberIds before repeats and
	// the creator are removed: a list may name members more than once, but
	// not without end.
	maxMemberIDEntries = 10 * MaxDialogMembers
	MaxPageLimit       = 100
	DefaultPageLimit   = 50
	MaxClientMessageID = 64
)

type dialogDTO struct {
	ID        string   `json:"id"`
	Title     string   `json:"title"`
	MemberIDs []string `json:"memberIds"`
	LastSeq   int64    `json:"lastSeq"`
	CreatedAt int64    `json:"createdAt"`
}

func toDialogDTO(d store.Dialog) dialogDTO {
	m := d.MemberIDs
	if m == nil {
		m = []string{}
	}
	return dialogDTO{ID: d.ID, Title: d.Title, MemberIDs: m, LastSeq: d.LastSeq, CreatedAt: d.CreatedAt.UnixMilli()}
}

// listedDialogDTO is a dialog as the listing shows it: with its newest
// message rendered exactly as the history renders it, null when it has none.
type listedDialogDTO struct {
	dialogDTO
	LastMessage *MessageDTO `json:"lastMessage"`
}

// MessageDTO is the message as clients see it, over REST and in realtime
// event data.
type MessageDTO struct {
	// pubsub.Message is the form message.created events carry, so an
	// event's data and the REST answer are the same bytes.
	pubsub.Message
	// Safety is "pending" in a send's answer while the legacy safety stub
	// is on (safety.go); absent otherwise.
	Safety string `json:"safety,omitempty"`
}

// ToMessageDTO converts a stored message (store.Message.Wire, the
// conversion its message.created event uses too).
func ToMessageDTO(m store.Message) MessageDTO {
	return MessageDTO{Message: m.Wire()}
}

type listDTO[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"nextCursor"`
}

func newList[T any](items []T, next string) listDTO[T] {
	if items == nil {
		items = []T{}
	}
	l := listDTO[T]{Items: items}
	if next != "" {
		l.NextCursor = &next
	}
	return l
}

type meDTO struct {
	ID string `json:"id"`
}

func (s *Server) me(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, meDTO{ID: principal(r).UserID})
}

// pathUUID reads a UUID path variable (400 invalid_uuid otherwise).
func pathUUID(r *http.Request, name string) (string, error) {
	id, ok := ids.Canonical(mux.Vars(r)[name])
	if !ok {
		return "", apiErr(http.StatusBadRequest, "invalid_uuid")
	}
	return id, nil
}

// parseLimit reads ?limit= (absent: def; given once, as digits, 1..max;
// else 400 invalid_limit).
func parseLimit(r *http.Request, def, max int) (int, error) {
	v, ok := onceQuery(r.URL.Query(), "limit")
	if !ok {
		return 0, apiErr(http.StatusBadRequest, "invalid_limit")
	}
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || v[0] < '0' || v[0] > '9' || n < 1 || n > max {
		// Digits only: Atoi also takes a sign.
		return 0, apiErr(http.StatusBadRequest, "invalid_limit")
	}
	return n, nil
}

type createDialogReq struct {
	MemberIDs *[]string `json:"memberIds"`
	Title     *string   `json:"title"`
}

func (s *Server) createDialog(w http.ResponseWriter, r *http.Request) error {
	if _, _, err := idemKeyHeader(r); err != nil {
		return err
	}
	var req createDialogReq
	if err := decodeJSON(w, r, ChatBodyLimit, &req); err != nil {
		return err
	}
	me := principal(r).UserID
	if req.MemberIDs == nil || len(*req.MemberIDs) == 0 || len(*req.MemberIDs) > maxMemberIDEntries {
		return apiErr(http.StatusBadRequest, "invalid_members")
	}
	// The other members, each once, in a fixed order: the creator is added
	// by the store, and a retry that lists them otherwise (another order,
	// a repeat, the creator) is the same request. The member bound counts
	// the dialog's members, the creator included, not the entries.
	members := make([]string, 0, len(*req.MemberIDs))
	for _, m := range *req.MemberIDs {
		id, ok := ids.Canonical(m)
		if !ok {
			return apiErr(http.StatusBadRequest, "invalid_members")
		}
		if id != me {
			members = append(members, id)
		}
	}
	slices.Sort(members)
	if members = slices.Compact(members); len(members) == 0 || len(members)+1 > MaxDialogMembers {
		return apiErr(http.StatusBadRequest, "invalid_members")
	}
	title := ""
	if req.Title != nil {
		// Control characters are refused anywhere, the ends included (not
		// trimmed away), and so are the line and paragraph separators
		// (U+2028, U+2029), which break the line as LF does, and invisible
		// characters outside the text that needs them (hasHiddenChar),
		// which reorder or hide what the members read.
		if hasControl(*req.Title) || hasLineSeparator(*req.Title) || hasHiddenChar(*req.Title) {
			return apiErr(http.StatusBadRequest, "invalid_title")
		}
		title = strings.TrimSpace(*req.Title)
		if utf8.RuneCountInString(title) > MaxTitleChars {
			return apiErr(http.StatusBadRequest, "invalid_title")
		}
	}
	s.createDialogIdempotent(w, r, me, title, members)
	return nil
}

// pageLimit is parseLimit for the chat listings, where ?limit= given twice
// is 400 invalid_limit: no value of the two is the one the client meant.
func pageLimit(r *http.Request) (int, error) {
	return parseLimit(r, DefaultPageLimit, MaxPageLimit)
}

// onceQuery reads a query parameter that may be given at most once; ok is
// false when it is repeated (even with the same value, or empty): a client
// that appends &cursor=<nextCursor> to the URL of the previous page must
// learn of it, not get that page again.
func onceQuery(q url.Values, name string) (v string, ok bool) {
	vs := q[name]
	if len(vs) > 1 {
		return "", false
	}
	if len(vs) == 1 {
		v = vs[0]
	}
	return v, true
}

func (s *Server) listDialogs(w http.ResponseWriter, r *http.Request) error {
	limit, err := pageLimit(r)
	if err != nil {
		return err
	}
	cursor, ok := onceQuery(r.URL.Query(), "cursor")
	if !ok {
		return errInvalidCursor
	}
	items, next, err := s.store.ListDialogs(r.Context(), principal(r).UserID, cursor, limit)
	if err != nil {
		return err
	}
	out := make([]listedDialogDTO, len(items))
	for i, d := range items {
		out[i] = listedDialogDTO{dialogDTO: toDialogDTO(d)}
		if d.LastMessage != nil {
			m := ToMessageDTO(*d.LastMessage)
			out[i].LastMessage = &m
		}
	}
	writeJSON(w, http.StatusOK, newList(out, next))
	return nil
}

type sendMessageReq struct {
	Body            *string   `json:"body"`
	ClientMessageID *string   `json:"clientMessageId"`
	AttachmentIDs   *[]string `json:"attachmentIds"`
}

// validateMessage checks a send request; body must hold 1..4000 characters
// that are not all white space, and no U+0000, which a PostgreSQL text
// column cannot store.
func validateMessage(req sendMessageReq) (body, cmid string, err error) {
	if req.Body == nil {
		return "", "", apiErr(http.StatusBadRequest, "invalid_body")
	}
	body = *req.Body
	if strings.TrimSpace(body) == "" || utf8.RuneCountInString(body) > MaxMessageChars || strings.ContainsRune(body, 0) {
		return "", "", apiErr(http.StatusBadRequest, "invalid_body")
	}
	if req.ClientMessageID != nil {
		cmid = *req.ClientMessageID
		if cmid == "" || len(cmid) > MaxClientMessageID || !printableASCII(cmid) {
			return "", "", apiErr(http.StatusBadRequest, "invalid_client_message_id")
		}
	}
	return body, cmid, nil
}

func (s *Server) sendMessage(w http.ResponseWriter, r *http.Request) error {
	dialogID, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	if _, _, err := idemKeyHeader(r); err != nil {
		return err
	}
	var req sendMessageReq
	if err := decodeJSON(w, r, ChatBodyLimit, &req); err != nil {
		return err
	}
	body, cmid, err := validateMessage(req)
	if err != nil {
		return err
	}
	attIDs, err := validateAttachmentIDs(req.AttachmentIDs)
	if err != nil {
		return err
	}
	s.sendMessageIdempotent(w, r, store.SendMessage{
		DialogID: dialogID, SenderID: principal(r).UserID, Body: body, ClientMessageID: cmid, AttachmentIDs: attIDs,
		Event: true,
	})
	return nil
}

// publishAfterCommit publishes the event right after the commit (without
// waiting, when the publisher can) and then queues the outbox row's
// delivered mark (one batched UPDATE for many messages). A failure is not
// the client's: the row stays pending for the outbox relay, and clients
// reconcile over REST anyway.
func (s *Server) publishAfterCommit(ctx context.Context, ev store.OutboxEvent) {
	if s.publisher == nil || ev.EventID == "" {
		return
	}
	published := func(err error) {
		if err != nil {
			s.metrics.errors.WithLabelValues("redis", "publish").Inc()
			s.logger.LogAttrs(ctx, slog.LevelWarn, "publish after commit failed; left to the outbox relay",
				slog.String("event_id", ev.EventID))
			return
		}
		s.marker.Mark(ev.EventID)
	}
	if lp, ok := s.publisher.(laterPublisher); ok {
		// Not waited for: the publishes of concurrent sends share one
		// round trip; the outbox row stays pending until it is marked.
		lp.PublishLater(ev.Channel, ev.Payload, published)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PublishTimeout)
	defer cancel()
	published(s.publisher.Publish(ctx, ev.Channel, ev.Payload))
}

// laterPublisher is a Publisher that can also publish without the caller
// waiting (pubsub.Publisher).
type laterPublisher interface {
	PublishLater(channel string, payload []byte, done func(error))
}

func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) error {
	dialogID, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	limit, err := pageLimit(r)
	if err != nil {
		return err
	}
	after, err := historyAfter(r)
	if err != nil {
		return err
	}
	ok, err := s.store.IsMember(r.Context(), dialogID, principal(r).UserID)
	if err != nil {
		return err
	}
	if !ok {
		return store.ErrDialogNotFound
	}
	msgs, more, err := s.store.ListMessages(r.Context(), dialogID, after, limit)
	if err != nil {
		return err
	}
	out := make([]MessageDTO, len(msgs))
	for i, m := range msgs {
		out[i] = ToMessageDTO(m)
	}
	next := ""
	if more && len(out) > 0 {
		next = strconv.FormatInt(out[len(out)-1].Seq, 10)
	}
	writeJSON(w, http.StatusOK, newList(out, next))
	return nil
}

// historyAfter reads where a history page starts: ?afterSeq=N, or
// ?cursor=N, the nextCursor of the previous page, so a client can page by
// following nextCursor as in every other listing. Both at once, either
// given twice, or a value that is not a seq, is 400 invalid_cursor; neither
// is the beginning. Other query parameters are ignored (cache-busting
// clients add them).
func historyAfter(r *http.Request) (int64, error) {
	q := r.URL.Query()
	v, ok1 := onceQuery(q, "afterSeq")
	cursor, ok2 := onceQuery(q, "cursor")
	if !ok1 || !ok2 || (q.Has("afterSeq") && q.Has("cursor")) {
		return 0, errInvalidCursor
	}
	if cursor != "" {
		v = cursor
	}
	if v == "" {
		return 0, nil
	}
	after, err := strconv.ParseInt(v, 10, 64)
	if err != nil || v[0] < '0' || v[0] > '9' {
		// Digits only: ParseInt also takes a sign ("+1", "-0").
		return 0, errInvalidCursor
	}
	return after, nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return true
		}
	}
	return false
}

// hasLineSeparator reports whether s holds a line or paragraph separator
// (categories Zl and Zp: U+2028, U+2029). They break the line where s is
// shown, as LF does, so "report.pdf\u2028.exe" shows as "report.pdf" with
// ".exe" on the next line.
func hasLineSeparator(s string) bool {
	for _, r := range s {
		if unicode.In(r, unicode.Zl, unicode.Zp) {
			return true
		}
	}
	return false
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
