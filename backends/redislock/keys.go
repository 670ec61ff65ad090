package redislock

import "github.com/warden-go/warden/backends/internal/redistag"

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
