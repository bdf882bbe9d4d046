package projectapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/jcs"
	"github.com/han-app/gateway/restapi/apierr"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

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

// The routes of topics and subscriptions. A topic or subscription id in
// the path that is no UUID names nothing: 404 topic_not_found or
// subscription_not_found.
var (
	topicItem = spec{item: "topicId", notFound: ErrTopicNotFound}
	subItem   = spec{item: "subscriptionId", notFound: ErrSubscriptionNotFound}

	topicCreateRoute = route[topicIn]{spec: wholeProject.with(store.RoleWrite, objectBody, fieldCodes{"name": errInvalidTopicName}),
		parse: parseTopic, do: (*API).createTopic}
	topicDeleteRoute = deleteRoute(topicItem, (*project.Queue).DeleteTopic)
	messageListRoute = route[pageIn]{spec: topicItem.with(store.RoleRead, noBody, nil),
		parse: parsePage, do: (*API).listMessages}
	publishRoute = route[project.PublishInput]{spec: topicItem.with(store.RoleWrite, objectBody, fieldCodes{"payload": errInvalidPayload}).large(),
		parse: parsePublish, do: (*API).publish}
	trimRoute = route[struct{}]{spec: topicItem.with(store.RoleWrite, optionalBody, nil),
		do: (*API).trim}
	subCreateRoute = route[subIn]{spec: wholeProject.with(store.RoleWrite, objectBody, nil),
		parse: parseSubscription, do: (*API).createSubscription}
	subPatchRoute = route[string]{spec: subItem.with(store.RoleWrite, objectBody, fieldCodes{"status": errInvalidSubStatus}),
		parse: parseSubStatus, do: (*API).patchSubscription}
	subDeleteRoute   = deleteRoute(subItem, (*project.Queue).DeleteSubscription)
	receiptListRoute = route[pageIn]{spec: subItem.with(store.RoleRead, noBody, nil),
		parse: parsePage, do: (*API).listReceipts}
	claimRoute = route[int64]{spec: subItem.with(store.RoleWrite, objectBody, fieldCodes{"count": errInvalidCount}),
		parse: parseClaimCount, do: (*API).claim}
	receiptPostRoute = route[ackIn]{spec: subItem.with(store.RoleWrite, objectBody, fieldCodes{"status": errInvalidReceiptStatus}),
		parse: parseAck, do: (*API).ack}
)

// deleteRoute is DELETE of a topic or subscription: write role, the
// eviction-policy gate, then the delete script; 204.
func deleteRoute(item spec, del func(q *project.Queue, ctx context.Context, k project.Keys, projectID, id string) error) route[struct{}] {
	return route[struct{}]{spec: item.with(store.RoleWrite, noBody, nil),
		do: func(a *API, ctx context.Context, c *call, _ struct{}) (reply, error) {
			return reply{status: http.StatusNoContent, noStore: true}, del(a.queue, ctx, c.keys, c.info.ID, c.id)
		}}
}

type topicIn struct{ name, description string }

func parseTopic(c *call) (topicIn, error) {
	var in topicIn
	var ok bool
	if in.name, ok = stringToken(c.body["name"]); !ok || !validName(in.name, project.TopicNameMaxBytes) {
		return in, errInvalidTopicName
	}
	desc, present := c.body["description"]
	if in.description, ok = optionalString(desc, present); !ok || len(in.description) > project.TopicDescriptionMaxBytes {
		return in, apierr.InvalidJSON
	}
	return in, nil
}

func (a *API) createTopic(ctx context.Context, c *call, in topicIn) (reply, error) {
	t, err := a.queue.CreateTopic(ctx, c.keys, ids.New(), in.name, in.description)
	return reply{status: http.StatusCreated, body: topicDTO(t)}, err
}

// pageIn is a listing's ?limit= and ?cursor=.
type pageIn struct {
	limit  int
	cursor string
}

func parsePage(c *call) (pageIn, error) {
	n, err := c.limit(project.MessagePageDefault, project.CachePageMax)
	if err != nil {
		return pageIn{}, err
	}
	cursor, err := c.cursor()
	return pageIn{limit: n, cursor: cursor}, err
}

func (a *API) listMessages(ctx context.Context, c *call, in pageIn) (reply, error) {
	msgs, next, err := a.queue.ListMessages(ctx, c.keys, c.id, in.cursor, in.limit)
	return reply{status: http.StatusOK, body: newPage(msgs, next, toMessageDTO)}, err
}

// parsePublish validates a publish body: producerId and clientEventId are
// strings of 1..256 bytes without control characters (invalid_json
// otherwise: they have no code of their own), payload a JSON object
// (invalid_payload) whose RFC 8785 canonical form is at most 16 KiB
// (message_too_large).
func parsePublish(c *call) (project.PublishInput, error) {
	var in project.PublishInput
	var ok bool
	if in.ProducerID, ok = stringToken(c.body["producerId"]); !ok || !validName(in.ProducerID, project.ProducerIDMaxBytes) {
		return in, apierr.InvalidJSON
	}
	if in.ClientEventID, ok = stringToken(c.body["clientEventId"]); !ok || !validName(in.ClientEventID, project.ClientEventIDMaxBytes) {
		return in, apierr.InvalidJSON
	}
	raw, present := c.body["payload"]
	if !present || len(raw) == 0 || raw[0] != '{' {
		return in, errInvalidPayload
	}
	// The length is measured before anything is decoded: a payload far
	// over the limit costs one pass over its bytes, not its decoding.
	canon, err := jcs.CanonicalizeMax(raw, project.MessageMaxBytes)
	if errors.Is(err, jcs.ErrTooLarge) {
		return in, errMessageTooLarge
	}
	if err != nil {
		return in, errInvalidPayload
	}
	in.Payload = canon
	return in, nil
}

func (a *API) publish(ctx context.Context, c *call, in project.PublishInput) (reply, error) {
	msg, replay, err := a.queue.Publish(ctx, c.keys, c.info.ID, c.id, in)
	status := http.StatusCreated
	if replay {
		status = http.StatusOK
	}
	return reply{status: status, body: toMessageDTO(msg)}, err
}

// trim: the body is {}; its members are ignored, but it must be JSON when
// present.
func (a *API) trim(ctx context.Context, c *call, _ struct{}) (reply, error) {
	res, err := a.queue.Trim(ctx, c.keys, c.info.ID, c.id)
	return reply{status: http.StatusOK, body: trimDTO{Trimmed: res.Trimmed, ReleasedBytes: res.ReleasedBytes}}, err
}

type subIn struct{ topicID, name string }

func parseSubscription(c *call) (subIn, error) {
	rawTopic, ok := stringToken(c.body["topicId"])
	if !ok {
		return subIn{}, apierr.InvalidJSON
	}
	name, ok := stringToken(c.body["name"])
	if !ok || !validName(name, project.TopicNameMaxBytes) {
		return subIn{}, apierr.InvalidJSON
	}
	tid, ok := ids.Canonical(rawTopic)
	if !ok {
		return subIn{}, ErrTopicNotFound
	}
	return subIn{topicID: tid, name: name}, nil
}

func (a *API) createSubscription(ctx context.Context, c *call, in subIn) (reply, error) {
	sub, err := a.queue.CreateSubscription(ctx, c.keys, ids.New(), in.topicID, in.name)
	return reply{status: http.StatusCreated, body: subscriptionDTO(sub)}, err
}

func parseSubStatus(c *call) (string, error) {
	status, ok := stringToken(c.body["status"])
	if !ok || (status != "online" && status != "paused") {
		return "", errInvalidSubStatus
	}
	return status, nil
}

func (a *API) patchSubscription(ctx context.Context, c *call, status string) (reply, error) {
	sub, err := a.queue.SetSubscriptionStatus(ctx, c.keys, c.id, status)
	return reply{status: http.StatusOK, body: subscriptionDTO(sub)}, err
}

func (a *API) listReceipts(ctx context.Context, c *call, in pageIn) (reply, error) {
	recs, next, err := a.queue.ListReceipts(ctx, c.keys, c.id, in.cursor, in.limit)
	return reply{status: http.StatusOK, body: newPage(recs, next, toReceiptDTO)}, err
}

func parseClaimCount(c *call) (int64, error) {
	count, ok := positiveInt(c.body["count"], project.ClaimCountMax)
	if !ok {
		return 0, errInvalidCount
	}
	return count, nil
}

func (a *API) claim(ctx context.Context, c *call, count int64) (reply, error) {
	items, err := a.queue.Claim(ctx, c.keys, c.id, int(count), c.info.DeliveryPaused)
	out := claimDTO{Items: make([]claimItemDTO, 0, len(items))}
	for _, it := range items {
		out.Items = append(out.Items, claimItemDTO{Message: toMessageDTO(it.Message), Receipt: toReceiptDTO(it.Receipt),
			Token: it.Token, LeaseUntil: it.LeaseUntil})
	}
	return reply{status: http.StatusOK, body: out, noStore: true}, err
}

type ackIn struct{ messageID, token, status, result string }

func parseAck(c *call) (ackIn, error) {
	var in ackIn
	msgID, ok1 := stringToken(c.body["messageId"])
	token, ok2 := stringToken(c.body["token"])
	if !ok1 || !ok2 {
		return in, apierr.InvalidJSON
	}
	status, ok := stringToken(c.body["status"])
	if !ok || (status != "processed" && status != "failed") {
		return in, errInvalidReceiptStatus
	}
	res, present := c.body["result"]
	result, ok := optionalString(res, present)
	if !ok {
		return in, apierr.InvalidJSON
	}
	if len(result) > project.ResultMaxBytes {
		return in, errResultTooLarge
	}
	return ackIn{messageID: msgID, token: token, status: status, result: result}, nil
}

func (a *API) ack(ctx context.Context, c *call, in ackIn) (reply, error) {
	rc, _, err := a.queue.Ack(ctx, c.keys, c.id, in.messageID, in.token, in.status, in.result)
	return reply{status: http.StatusOK, body: toReceiptDTO(rc)}, err
}
