package restapi

import (
	"context"
	"net/http"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/jcs"
	"github.com/han-app/gateway/internal/jsonx"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

var (
	errTopicNotFound        = apiErr(http.StatusNotFound, "topic_not_found")
	errSubscriptionNotFound = apiErr(http.StatusNotFound, "subscription_not_found")
	errInvalidTopicName     = apiErr(http.StatusBadRequest, "invalid_topic_name")
	errInvalidPayload       = apiErr(http.StatusBadRequest, "invalid_payload")
	errMessageTooLarge      = apiErr(http.StatusBadRequest, "message_too_large")
	errInvalidCount         = apiErr(http.StatusBadRequest, "invalid_count")
	errInvalidReceiptStatus = apiErr(http.StatusBadRequest, "invalid_receipt_status")
	errResultTooLarge       = apiErr(http.StatusBadRequest, "result_too_large")
	errInvalidSubStatus     = apiErr(http.StatusBadRequest, "invalid_subscription_status")
)

// newProjectQueue builds the Redis side of topics and subscriptions and
// its metrics.
func (s *Server) newProjectQueue() *project.Queue {
	c := s.cfg.ProjectQueue
	q := project.NewQueue(s.rdb, project.NewModuleBudget(s.rdb, s.prj.env, c.ModuleCap()), c)
	f := prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: projectMetricsNamespace, Name: "module_budget_settle_failures_total",
		Help: "Module budget settlements that failed (the module counter over-counts until the next reconcile)."},
		func() float64 { return float64(q.SettleFailures()) })
	_ = s.metrics.Registry.Register(f)
	return q
}

// projectQueueRoutes mounts the topic, subscription, claim and receipt
// routes on the project subrouter.
func (s *Server) projectQueueRoutes(p *mux.Router) {
	p.HandleFunc("/topics", s.projectByMethod(map[string]projectHandler{http.MethodPost: s.createTopic}))
	p.HandleFunc("/topics/{topicId}", s.projectByMethod(map[string]projectHandler{http.MethodDelete: s.deleteTopic}))
	p.HandleFunc("/topics/{topicId}/messages", s.projectByMethod(map[string]projectHandler{
		http.MethodGet: s.listTopicMessages, http.MethodPost: s.publishMessage}))
	p.HandleFunc("/topics/{topicId}/trim", s.projectByMethod(map[string]projectHandler{http.MethodPost: s.trimTopic}))
	p.HandleFunc("/subscriptions", s.projectByMethod(map[string]projectHandler{http.MethodPost: s.createSubscription}))
	p.HandleFunc("/subscriptions/{subscriptionId}", s.projectByMethod(map[string]projectHandler{
		http.MethodPatch: s.patchSubscription, http.MethodDelete: s.deleteSubscription}))
	p.HandleFunc("/subscriptions/{subscriptionId}/receipts", s.projectByMethod(map[string]projectHandler{
		http.MethodGet: s.listReceipts, http.MethodPost: s.postReceipt}))
	p.HandleFunc("/subscriptions/{subscriptionId}/claim", s.projectByMethod(map[string]projectHandler{http.MethodPost: s.claim}))
}

// DTOs (docs/project-redis-api.md; timestamps epoch ms).

type topicDTO struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	CreatedAt   int64  `json:"createdAt"`
}

type subscriptionDTO struct {
	ID        string `json:"id"`
	TopicID   string `json:"topicId"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	CreatedAt int64  `json:"createdAt"`
}

type messageDTO struct {
	ID            string          `json:"id"`
	TopicID       string          `json:"topicId"`
	ProducerID    string          `json:"producerId"`
	ClientEventID string          `json:"clientEventId"`
	Payload       json.RawMessage `json:"payload"`
	SizeBytes     int64           `json:"sizeBytes"`
	PublishedAt   int64           `json:"publishedAt"`
}

func toMessageDTO(m project.TopicMessage) messageDTO {
	return messageDTO{ID: m.ID, TopicID: m.TopicID, ProducerID: m.ProducerID, ClientEventID: m.ClientEventID,
		Payload: json.RawMessage(m.Payload), SizeBytes: m.SizeBytes, PublishedAt: m.PublishedAt}
}

type receiptDTO struct {
	MessageID      string  `json:"messageId"`
	SubscriptionID string  `json:"subscriptionId"`
	Status         string  `json:"status"`
	Attempts       int     `json:"attempts"`
	LeaseUntil     *int64  `json:"leaseUntil"`
	Result         *string `json:"result"`
	UpdatedAt      int64   `json:"updatedAt"`
}

func toReceiptDTO(r project.Receipt) receiptDTO {
	d := receiptDTO{MessageID: r.MessageID, SubscriptionID: r.SubscriptionID, Status: r.Status, Attempts: r.Attempts,
		Result: r.Result, UpdatedAt: r.UpdatedAt}
	if r.LeaseUntil > 0 {
		l := r.LeaseUntil
		d.LeaseUntil = &l
	}
	return d
}

type claimItemDTO struct {
	Message    messageDTO `json:"message"`
	Receipt    receiptDTO `json:"receipt"`
	Token      string     `json:"token"`
	LeaseUntil int64      `json:"leaseUntil"`
}

type claimDTO struct {
	Items []claimItemDTO `json:"items"`
}

type trimDTO struct {
	Trimmed       int64 `json:"trimmed"`
	ReleasedBytes int64 `json:"releasedBytes"`
}

// snapshotQueue fills the snapshot's topics, subscriptions and budget.
func (s *Server) snapshotQueue(ctx context.Context, pr projectReq, dto *projectSnapshotDTO) error {
	q := s.prj.queue
	st, err := q.State(ctx, pr.keys)
	if err != nil {
		return err
	}
	mod, err := q.Module().Usage(ctx)
	if err != nil {
		return err
	}
	dto.Topics = make([]any, 0, len(st.Topics))
	for _, t := range st.Topics {
		dto.Topics = append(dto.Topics, topicDTO(t))
	}
	dto.Subscriptions = make([]any, 0, len(st.Subscriptions))
	for _, sub := range st.Subscriptions {
		dto.Subscriptions = append(dto.Subscriptions, subscriptionDTO(sub))
	}
	cfg := q.Config()
	dto.Budget = budgetDTO{LimitBytes: cfg.ProjectBudgetBytes, UsedBytes: st.UsedBytes(), ModuleLimitBytes: q.Module().Cap(),
		MessageBytes: st.MessageBytes, ReceiptBytes: st.ReceiptBytes, DedupeBytes: st.DedupeBytes,
		ModuleUsedBytes: mod.Committed + mod.Reserved}
	dto.Limits.ProjectBudgetBytes = int(cfg.ProjectBudgetBytes)
	dto.Limits.ModuleBudgetBytes = int(q.Module().Cap())
	dto.Limits.LeaseSeconds = int(cfg.Lease / time.Second)
	dto.Limits.PublishDedupeSeconds = int(cfg.DedupeWindow / time.Second)
	return nil
}

// pathID reads a resource id from the path: anything but a UUID names no
// resource of this project.
// projectItem checks the caller's project role, then reads the id of one of
// the project's resources from the path (notFound when it is no UUID).
func (s *Server) projectItem(r *http.Request, need, name string, notFound *Error) (projectReq, string, error) {
	pr, err := s.projectAccess(r, need)
	if err != nil {
		return projectReq{}, "", err
	}
	id, err := pathID(r, name, notFound)
	if err != nil {
		return projectReq{}, "", err
	}
	return pr, id, nil
}

func pathID(r *http.Request, name string, notFound *Error) (string, error) {
	id, ok := ids.Canonical(mux.Vars(r)[name])
	if !ok {
		return "", notFound
	}
	return id, nil
}

// validName: 1..max bytes of UTF-8 without control characters (Cc).
func validName(s string, max int) bool {
	if len(s) == 0 || len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.Is(unicode.Cc, r) {
			return false
		}
	}
	return true
}

// readMembers reads the body and returns its top-level members; a problem
// inside a member with a code of its own maps to that code,
// anything else to invalid_json.
func readMembers(w http.ResponseWriter, r *http.Request, fieldCodes map[string]*Error) (map[string]json.RawMessage, error) {
	b, err := readProjectBody(w, r)
	if err != nil {
		return nil, err
	}
	members, err := jsonx.TopLevel(b)
	if err != nil {
		if e, ok := fieldCodes[projectFieldProblem(err, len(b))]; ok {
			return nil, e
		}
		return nil, errInvalidJSON
	}
	return members, nil
}

// optionalString decodes an absent or string member; ok is false for any
// other token (null included).
func optionalString(raw json.RawMessage, present bool) (string, bool) {
	if !present {
		return "", true
	}
	return projectStringToken(raw)
}

func (s *Server) createTopic(w http.ResponseWriter, r *http.Request) error {
	pr, err := s.projectAccess(r, store.RoleWrite)
	if err != nil {
		return err
	}
	m, err := readMembers(w, r, map[string]*Error{"name": errInvalidTopicName})
	if err != nil {
		return err
	}
	name, ok := projectStringToken(m["name"])
	if !ok || !validName(name, project.TopicNameMaxBytes) {
		return errInvalidTopicName
	}
	desc, present := m["description"]
	description, ok := optionalString(desc, present)
	if !ok || len(description) > project.TopicDescriptionMaxBytes {
		return errInvalidJSON
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	t, err := s.prj.queue.CreateTopic(ctx, pr.keys, ids.New(), name, description)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, topicDTO(t))
	return nil
}

func (s *Server) deleteTopic(w http.ResponseWriter, r *http.Request) error {
	return s.deleteProjectItem(w, r, "topicId", errTopicNotFound, s.prj.queue.DeleteTopic)
}

// deleteProjectItem is DELETE of a topic or subscription: write role, the
// eviction-policy gate, then the delete script; 204.
func (s *Server) deleteProjectItem(w http.ResponseWriter, r *http.Request, name string, notFound *Error,
	del func(ctx context.Context, k project.Keys, projectID, id string) error) error {
	pr, id, err := s.projectItem(r, store.RoleWrite, name, notFound)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	if err := del(ctx, pr.keys, pr.info.ID, id); err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listTopicMessages(w http.ResponseWriter, r *http.Request) error {
	pr, tid, err := s.projectItem(r, store.RoleRead, "topicId", errTopicNotFound)
	if err != nil {
		return err
	}
	limit, err := parseLimit(r, project.MessagePageDefault, project.CachePageMax)
	if err != nil {
		return err
	}
	msgs, next, err := s.prj.queue.ListMessages(r.Context(), pr.keys, tid, r.URL.Query().Get("cursor"), limit)
	if err != nil {
		return err
	}
	items := make([]messageDTO, 0, len(msgs))
	for _, m := range msgs {
		items = append(items, toMessageDTO(m))
	}
	writeJSON(w, http.StatusOK, newList(items, next))
	return nil
}

// parsePublish validates a publish body: producerId and clientEventId are
// strings of 1..256 bytes without control characters (invalid_json
// otherwise: they have no code of their own), payload a JSON object
// (invalid_payload) whose RFC 8785 canonical form is at most 16 KiB
// (message_too_large).
func parsePublish(m map[string]json.RawMessage) (project.PublishInput, error) {
	var in project.PublishInput
	var ok bool
	if in.ProducerID, ok = projectStringToken(m["producerId"]); !ok || !validName(in.ProducerID, project.ProducerIDMaxBytes) {
		return in, errInvalidJSON
	}
	if in.ClientEventID, ok = projectStringToken(m["clientEventId"]); !ok || !validName(in.ClientEventID, project.ClientEventIDMaxBytes) {
		return in, errInvalidJSON
	}
	raw, present := m["payload"]
	if !present || len(raw) == 0 || raw[0] != '{' {
		return in, errInvalidPayload
	}
	canon, err := jcs.Canonicalize(raw)
	if err != nil {
		return in, errInvalidPayload
	}
	if len(canon) > project.MessageMaxBytes {
		return in, errMessageTooLarge
	}
	in.Payload = canon
	return in, nil
}

func (s *Server) publishMessage(w http.ResponseWriter, r *http.Request) error {
	pr, tid, err := s.projectItem(r, store.RoleWrite, "topicId", errTopicNotFound)
	if err != nil {
		return err
	}
	m, err := readMembers(w, r, map[string]*Error{"payload": errInvalidPayload})
	if err != nil {
		return err
	}
	in, err := parsePublish(m)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	msg, replay, err := s.prj.queue.Publish(ctx, pr.keys, pr.info.ID, tid, in)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if replay {
		status = http.StatusOK
	}
	writeJSON(w, status, toMessageDTO(msg))
	return nil
}

func (s *Server) trimTopic(w http.ResponseWriter, r *http.Request) error {
	pr, tid, err := s.projectItem(r, store.RoleWrite, "topicId", errTopicNotFound)
	if err != nil {
		return err
	}
	// The body is {}; its members are ignored, but it must be
	// JSON when present.
	b, err := readProjectBody(w, r)
	if err != nil {
		return err
	}
	if len(b) > 0 {
		if _, err := jsonx.TopLevel(b); err != nil {
			return errInvalidJSON
		}
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	res, err := s.prj.queue.Trim(ctx, pr.keys, pr.info.ID, tid)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, trimDTO{Trimmed: res.Trimmed, ReleasedBytes: res.ReleasedBytes})
	return nil
}

func (s *Server) createSubscription(w http.ResponseWriter, r *http.Request) error {
	pr, err := s.projectAccess(r, store.RoleWrite)
	if err != nil {
		return err
	}
	m, err := readMembers(w, r, nil)
	if err != nil {
		return err
	}
	rawTopic, ok := projectStringToken(m["topicId"])
	if !ok {
		return errInvalidJSON
	}
	name, ok := projectStringToken(m["name"])
	if !ok || !validName(name, project.TopicNameMaxBytes) {
		return errInvalidJSON
	}
	tid, ok := ids.Canonical(rawTopic)
	if !ok {
		return errTopicNotFound
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	sub, err := s.prj.queue.CreateSubscription(ctx, pr.keys, ids.New(), tid, name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, subscriptionDTO(sub))
	return nil
}

func (s *Server) patchSubscription(w http.ResponseWriter, r *http.Request) error {
	pr, sid, err := s.projectItem(r, store.RoleWrite, "subscriptionId", errSubscriptionNotFound)
	if err != nil {
		return err
	}
	m, err := readMembers(w, r, map[string]*Error{"status": errInvalidSubStatus})
	if err != nil {
		return err
	}
	status, ok := projectStringToken(m["status"])
	if !ok || (status != "online" && status != "paused") {
		return errInvalidSubStatus
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	sub, err := s.prj.queue.SetSubscriptionStatus(ctx, pr.keys, sid, status)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, subscriptionDTO(sub))
	return nil
}

func (s *Server) deleteSubscription(w http.ResponseWriter, r *http.Request) error {
	return s.deleteProjectItem(w, r, "subscriptionId", errSubscriptionNotFound, s.prj.queue.DeleteSubscription)
}

func (s *Server) listReceipts(w http.ResponseWriter, r *http.Request) error {
	pr, sid, err := s.projectItem(r, store.RoleRead, "subscriptionId", errSubscriptionNotFound)
	if err != nil {
		return err
	}
	limit, err := parseLimit(r, project.MessagePageDefault, project.CachePageMax)
	if err != nil {
		return err
	}
	recs, next, err := s.prj.queue.ListReceipts(r.Context(), pr.keys, sid, r.URL.Query().Get("cursor"), limit)
	if err != nil {
		return err
	}
	items := make([]receiptDTO, 0, len(recs))
	for _, rc := range recs {
		items = append(items, toReceiptDTO(rc))
	}
	writeJSON(w, http.StatusOK, newList(items, next))
	return nil
}

func (s *Server) claim(w http.ResponseWriter, r *http.Request) error {
	pr, sid, err := s.projectItem(r, store.RoleWrite, "subscriptionId", errSubscriptionNotFound)
	if err != nil {
		return err
	}
	m, err := readMembers(w, r, map[string]*Error{"count": errInvalidCount})
	if err != nil {
		return err
	}
	count, ok := projectPositiveInt(m["count"], project.ClaimCountMax)
	if !ok {
		return errInvalidCount
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	items, err := s.prj.queue.Claim(ctx, pr.keys, sid, int(count), pr.info.DeliveryPaused)
	if err != nil {
		return err
	}
	out := claimDTO{Items: make([]claimItemDTO, 0, len(items))}
	for _, it := range items {
		out.Items = append(out.Items, claimItemDTO{Message: toMessageDTO(it.Message), Receipt: toReceiptDTO(it.Receipt),
			Token: it.Token, LeaseUntil: it.LeaseUntil})
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) postReceipt(w http.ResponseWriter, r *http.Request) error {
	pr, sid, err := s.projectItem(r, store.RoleWrite, "subscriptionId", errSubscriptionNotFound)
	if err != nil {
		return err
	}
	m, err := readMembers(w, r, map[string]*Error{"status": errInvalidReceiptStatus})
	if err != nil {
		return err
	}
	msgID, ok1 := projectStringToken(m["messageId"])
	token, ok2 := projectStringToken(m["token"])
	if !ok1 || !ok2 {
		return errInvalidJSON
	}
	status, ok := projectStringToken(m["status"])
	if !ok || (status != "processed" && status != "failed") {
		return errInvalidReceiptStatus
	}
	res, present := m["result"]
	result, ok := optionalString(res, present)
	if !ok {
		return errInvalidJSON
	}
	if len(result) > project.ResultMaxBytes {
		return errResultTooLarge
	}
	ctx := r.Context()
	if err := s.prj.gate.CheckWrite(ctx); err != nil {
		return err
	}
	rc, _, err := s.prj.queue.Ack(ctx, pr.keys, sid, msgID, token, status, result)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toReceiptDTO(rc))
	return nil
}
