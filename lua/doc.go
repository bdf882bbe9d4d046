// Package lua holds every Redis Lua script of the service as a file in this
// folder, embedded with go:embed, and exports each one ready to run.
//
// Each script starts with a "#!lua" shebang that declares its flags: write
// scripts are refused up front when Redis is out of memory, and read-only
// scripts declare flags=no-writes so reads keep working under OOM. Every
// script reads the clock with TIME, touches only keys sharing one hash tag
// (so it runs unchanged on Redis Cluster), validates and reads before its
// first write, and checks redis.acl_check_cmd for its expiry command before
// writing a key that must carry a TTL. Run uses EVALSHA and reloads the
// script transparently on NOSCRIPT.
//
// Scripts are immutable after package init and safe for concurrent use.
package lua
