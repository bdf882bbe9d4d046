package gateway

import "github.com/han-app/gateway/pubsub"

// RecoveryKept is the bytes of message.created frames the dialog's
// recovery read keeps for the subscribes that join it while it lingers;
// false when no read of the dialog has ended and still serves joiners.
func (s *Service) RecoveryKept(dialogID string) (bytes int, ok bool) {
	r := s.hub.rec
	r.mu.Lock()
	defer r.mu.Unlock()
	df := r.dialogs[pubsub.DialogChannel(dialogID)]
	if df == nil || df.cur == nil || !df.cur.ended {
		return 0, false
	}
	for _, e := range df.cur.res.Events {
		bytes += len(e.Frame)
	}
	return bytes, true
}
