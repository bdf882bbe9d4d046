package rds

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key,
// or of its hash tag (the text between the first "{" and the next "}", if
// not empty), modulo 16384. Commands that must stay on one node (a sharded
// SSUBSCRIBE, a script's keys) group their names by it.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// MasterAddr names the master a call on key goes to on a Redis Cluster
// client c, "" on any other client (one server) or without a slot map. The
// slot map is the client's own: no call is made. Bookkeeping of calls that
// got no reply uses it to settle only those on the master a caller waits
// for anyway, so a master that stalls holds only its own callers.
func MasterAddr(ctx context.Context, c any, key string) string {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}
