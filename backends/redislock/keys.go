package redislock

import (
	"strconv"
	"strings"

	"github.com/warden-go/warden/backends/internal/redistag"
)

// names builds the Redis keys and the channel of one lock key when a call
// needs them; a lease keeps only the key, since storing the nine derived
// names would cost more than a kilobyte per held lock. All of them share the
// hash tag {<key>}, so they live in one Cluster slot and a script may touch
// them together.
type names struct{ tag string }

func namesOf(key string) names { return names{"{" + redistag.Escape(key) + "}"} }

func (n names) lock() string         { return n.tag + ":lock" }
func (n names) fence() string        { return n.tag + ":fence" }
func (n names) queue() string        { return n.tag + ":queue" }
func (n names) waiters() string      { return n.tag + ":waiters" }
func (n names) deadlines() string    { return n.tag + ":queue:deadlines" }
func (n names) readers() string      { return n.tag + ":readers" }
func (n names) writer() string       { return n.tag + ":writer" }
func (n names) writeWaiters() string { return n.tag + ":writers-waiting" }
func (n names) permits() string      { return n.tag + ":permits" }
func (n names) channel() string      { return n.tag + ":released" }

// lockKeyOf is namesOf(key).lock() in one allocation, for refreshes.
func lockKeyOf(key string) string { return "{" + redistag.Escape(key) + "}:lock" }

// mutexNames are the keys and the channel that the scripts of a plain or
// fair lock name, cut from one string: building them costs one allocation,
// where a names method each costs one, on the path of every acquisition
// and release.
type mutexNames struct{ lock, queue, deadlines, waiters, channel string }

func mutexNamesOf(key string) mutexNames {
	e := redistag.Escape(key)
	s := "{" + e + "}:lock{" + e + "}:queue{" + e + "}:queue:deadlines{" + e + "}:waiters{" + e + "}:released"
	var m mutexNames
	for i, p := range []*string{&m.lock, &m.queue, &m.deadlines, &m.waiters, &m.channel} {
		end := len(s)
		if i < 4 {
			end = strings.Index(s[1:], "{") + 1
		}
		*p, s = s[:end], s[end:]
	}
	return m
}

// lockWaitersOf is mutexNamesOf(key)'s lock and waiters alone, cut from
// one string: all that the attempts of a plain lock name, at less than
// half the bytes to build.
func lockWaitersOf(key string) (lock, waiters string) {
	e := redistag.Escape(key)
	s := "{" + e + "}:lock{" + e + "}:waiters"
	i := len(e) + len("{}:lock")
	return s[:i], s[i:]
}

// releaseKeys are the keys of release.lua, unwait_mutex.lua and
// force_release.lua.
func (m mutexNames) releaseKeys() []string { return []string{m.lock, m.queue, m.deadlines, m.waiters} }

// plainRelease is what a plain lock's release sends when no fair waiter
// announced itself at its grant (see lease.releaseOn): the two keys of
// mutexNames it needs, and the free state it writes and the end of the
// owner's state it expects to find (see release_head.lua), which only a
// release whose grant found nobody waiting sends. They are cut from one
// string, one allocation. It is returned by pointer, since the release
// passes the addresses of its fields to go-redis.
type plainRelease struct{ lock, waiters, free, mine string }

func plainReleaseOf(key, owner string, token uint64, day uint32) *plainRelease {
	e := redistag.Escape(key)
	var num [20]byte
	var b strings.Builder
	b.Grow(2*len(e) + len("{}:lock{}:waiters0:::0:") + 2*len(num) + len(owner))
	b.WriteString("{")
	b.WriteString(e)
	b.WriteString("}:lock{")
	b.WriteString(e)
	b.WriteString("}:waiters")
	w := b.Len()
	b.WriteString("0:")
	b.Write(strconv.AppendUint(num[:0], token, 10))
	b.WriteString(":")
	b.Write(strconv.AppendUint(num[:0], uint64(day), 10))
	b.WriteString(":0:")
	f := b.Len()
	b.WriteString(owner)
	s := b.String()
	i := len(e) + len("{}:lock")
	return &plainRelease{lock: s[:i], waiters: s[i:w], free: s[w:f], mine: s[w+1:]}
}
