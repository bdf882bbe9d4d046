package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// ErrTicketInvalid is a ticket that is malformed, unknown, expired or
// already used.
var ErrTicketInvalid = errors.New("gateway: invalid ticket")

// ticketLen is the length of a ticket: 32 random bytes, base64url.
const ticketLen = 43

// Tickets issues and redeems one-time WebSocket tickets in Redis DB1. Only
// a SHA-256 of the ticket is stored (han:rt:ticket:v2:<ticket_hash>), so a
// Redis reader cannot use one. Its value is "<user_id> <exp_ms>": the user
// and the exp of the token that asked for the ticket, which the socket
// opened with it inherits. Safe for concurrent use.
type Tickets struct {
	rdb redis.UniversalClient
	ttl time.Duration
}

// NewTickets returns a ticket store; ttl zero means 30s.
func NewTickets(rdb redis.UniversalClient, ttl time.Duration) *Tickets {
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	return &Tickets{rdb: rdb, ttl: ttl}
}

// TicketKey is han:rt:ticket:v2:<hex sha256(ticket)>. The v2 segment came
// with the exp in the value: instances of the previous version, whose
// values hold only the user id, look up han:rt:ticket:<hash>, so during a
// rolling deploy neither version reads the other's tickets (a miss is 4001
// and the client fetches a new ticket) instead of misreading them.
func TicketKey(ticket string) string {
	sum := sha256.Sum256([]byte(ticket))
	return "han:rt:ticket:v2:" + hex.EncodeToString(sum[:])
}

// Issue creates a ticket for userID, valid once within the TTL;
// tokenExpires is the exp of the token that asked for it.
func (t *Tickets) Issue(ctx context.Context, userID string, tokenExpires time.Time) (string, time.Time, error) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	ticket := base64.RawURLEncoding.EncodeToString(b)
	val := userID + " " + strconv.FormatInt(tokenExpires.UnixMilli(), 10)
	ok, err := t.rdb.SetNX(ctx, TicketKey(ticket), val, t.ttl).Result()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("issue ticket: %w", rds.ClassifyRedisError(err))
	}
	if !ok {
		return "", time.Time{}, errors.New("gateway: ticket collision")
	}
	return ticket, time.Now().Add(t.ttl), nil
}

// Redeem consumes a ticket atomically and returns its user id and the exp
// of the token that issued it: ErrTicketInvalid if it cannot be used, a
// classified Redis error if Redis cannot answer.
func (t *Tickets) Redeem(ctx context.Context, ticket string) (string, time.Time, error) {
	if len(ticket) != ticketLen {
		return "", time.Time{}, ErrTicketInvalid
	}
	if _, err := base64.RawURLEncoding.DecodeString(ticket); err != nil {
		return "", time.Time{}, ErrTicketInvalid
	}
	v, err := lua.RTTicketRedeem.Run(ctx, t.rdb, []string{TicketKey(ticket)}).Text()
	if errors.Is(err, redis.Nil) {
		return "", time.Time{}, ErrTicketInvalid
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("redeem ticket: %w", rds.ClassifyRedisError(err))
	}
	userID, expMs, ok := strings.Cut(v, " ")
	ms, err := strconv.ParseInt(expMs, 10, 64)
	if !ok || err != nil {
		return "", time.Time{}, ErrTicketInvalid
	}
	return userID, time.UnixMilli(ms), nil
}
