package project

import "context"

// The publish, claim and ack of a topic or subscription send the same
// KEYS every time (and the publish the same leading arguments while the
// topic's subscriptions stay the same): the Queue builds them once and
// keeps them with the topic of a subscription and the subscriptions of a
// topic it caches anyway. The slices are shared by every call and never
// written after they are built. An entry holds about 1 KiB: the caches
// are bounded (subTopicMax, subsOfMax) and start over when full.

const (
	// subTopicMax and subsOfMax bound the subscriptions and topics a
	// Queue keeps (about 16 MiB and 8 MiB at most).
	subTopicMax = 1 << 14
	subsOfMax   = 1 << 13
)

// idKey names a topic or a subscription of one project.
type idKey struct{ prefix, id string }

// subKeys is what this instance knows of one subscription.
type subKeys struct {
	tid   string   // its topic (never changes)
	claim []string // KEYS of the claim script
	ack   []string // KEYS of the ack script
}

func newSubKeys(k Keys, subID, topicID string) *subKeys {
	claim := []string{k.Topics(), k.Subscriptions(), k.TopicStream(topicID), k.TopicOpen(topicID), k.TopicDone(topicID),
		k.Receipts(subID), k.Leases(subID)}
	// The ack's keys are five of the claim's (the same strings).
	return &subKeys{tid: topicID, claim: claim, ack: []string{claim[1], claim[3], claim[4], claim[5], claim[6]}}
}

// topicSubsKeys is a topic's subscriptions as last seen, with the publish
// script's KEYS and leading arguments for them.
type topicSubsKeys struct {
	sids    []string // sorted
	pubKeys []string
	pubHead []any
}

func (q *Queue) newTopicSubsKeys(k Keys, topicID string, sids []string) *topicSubsKeys {
	keys := make([]string, 0, 8+len(sids))
	keys = append(keys, k.Topics(), k.Budget(), k.Dedupe(), k.DedupeExpiry(), k.TopicStream(topicID),
		k.TopicSubscriptions(topicID), k.TopicOpen(topicID), k.TopicDone(topicID))
	head := make([]any, 0, 6+len(sids))
	head = append(head, topicID, q.cfg.ProjectBudgetBytes, ReceiptReserveBytes, q.cfg.DedupeWindow.Milliseconds(), dedupePurgeBatch, len(sids))
	for _, sid := range sids {
		keys = append(keys, k.Receipts(sid))
		head = append(head, sid)
	}
	return &topicSubsKeys{sids: sids, pubKeys: keys, pubHead: head}
}

// publishKeys returns the topic's subscriptions with the publish's KEYS
// and leading arguments: as last seen by this instance (one round trip
// less per publish: the publish script compares the list with the topic's
// SET and answers 'retry' when it changed), or read afresh when fresh.
func (q *Queue) publishKeys(ctx context.Context, k Keys, topicID string, fresh bool) (*topicSubsKeys, error) {
	if !fresh {
		q.mu.Lock()
		t, ok := q.subsOf[idKey{k.Prefix(), topicID}]
		q.mu.Unlock()
		if ok {
			return t, nil
		}
	}
	return q.readTopicSubs(ctx, k, topicID)
}
