package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// handoff is what a group's process hands the parent in its results file:
// its figures, and what the report says of its servers.
type handoff struct {
	Servers  []string          `json:"servers"` // the servers' versions
	Cycles   []entry           `json:"cycles"`
	Renewals []entry           `json:"renewals"`
	Idem     []entry           `json:"idempotency"`
	Tables   []json.RawMessage `json:"tables"`
	Failures []string          `json:"failures"`
	Retries  int               `json:"retries"`
}

// entry is one key of a results map with its repetitions' figures.
type entry struct {
	Key    json.RawMessage   `json:"key"`
	Values []json.RawMessage `json:"values"`
}

// fielded is a record written as the JSON array of its fields: fields
// lists pointers to every field, in a fixed order.
type fielded interface{ fields() []any }

func (k *cycleKey) fields() []any { return []any{&k.scenario, &k.n, &k.hold, &k.subject} }
func (k *renewKey) fields() []any { return []any{&k.n, &k.subject} }
func (k *idemKey) fields() []any  { return []any{&k.store, &k.phase} }
func (r *idemResult) fields() []any {
	return []any{&r.rps, &r.p50, &r.p99, &r.trips, &r.cmds, &r.foreign}
}
func (r *renewResult) fields() []any {
	return []any{&r.trips, &r.cmds, &r.heap, &r.stack, &r.lost, &r.foreign}
}
func (r *cycleResult) fields() []any {
	return []any{&r.ops, &r.p50, &r.p99, &r.hand50, &r.hand99, &r.back, &r.cmds, &r.trips, &r.idle, &r.foreign, &r.errs, &r.acquiring, &r.held}
}
func (t *tableState) fields() []any {
	return []any{&t.phase, &t.table, &t.live, &t.dead, &t.updates, &t.hot, &t.vacuums, &t.heap, &t.index}
}

// encodeFields writes fields as a JSON array. JSON has no NaN, which marks
// a figure that does not apply, nor infinities: a float that is not finite
// is written as the string strconv parses back.
func encodeFields(fields []any) (json.RawMessage, error) {
	out := make([]any, len(fields))
	for i, f := range fields {
		out[i] = f
		if p, ok := f.(*float64); ok && (math.IsNaN(*p) || math.IsInf(*p, 0)) {
			out[i] = strconv.FormatFloat(*p, 'g', -1, 64)
		}
	}
	return json.Marshal(out)
}

// decodeFields reads what encodeFields wrote into fields.
func decodeFields(raw json.RawMessage, fields []any) error {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return err
	}
	if len(items) != len(fields) {
		return fmt.Errorf("%d fields in %s, want %d", len(items), raw, len(fields))
	}
	for i, f := range fields {
		if p, ok := f.(*float64); ok && len(items[i]) > 0 && items[i][0] == '"' {
			var s string
			if err := json.Unmarshal(items[i], &s); err != nil {
				return err
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fmt.Errorf("field %d of %s: %w", i, raw, err)
			}
			*p = v
			continue
		}
		if err := json.Unmarshal(items[i], f); err != nil {
			return fmt.Errorf("field %d of %s: %w", i, raw, err)
		}
	}
	return nil
}

// encodeMap writes a results map as entries.
func encodeMap[K comparable, V any, PK interface {
	*K
	fielded
}, PV interface {
	*V
	fielded
}](m map[K][]V) ([]entry, error) {
	var out []entry
	for k, vs := range m {
		key, err := encodeFields(PK(&k).fields())
		if err != nil {
			return nil, err
		}
		e := entry{Key: key}
		for i := range vs {
			v, err := encodeFields(PV(&vs[i]).fields())
			if err != nil {
				return nil, err
			}
			e.Values = append(e.Values, v)
		}
		out = append(out, e)
	}
	return out, nil
}

// decodeMap adds entries to a results map, after what it holds.
func decodeMap[K comparable, V any, PK interface {
	*K
	fielded
}, PV interface {
	*V
	fielded
}](es []entry, m map[K][]V) error {
	for _, e := range es {
		var k K
		if err := decodeFields(e.Key, PK(&k).fields()); err != nil {
			return err
		}
		for _, raw := range e.Values {
			var v V
			if err := decodeFields(raw, PV(&v).fields()); err != nil {
				return err
			}
			m[k] = append(m[k], v)
		}
	}
	return nil
}

// handOff encodes what b measured, for the parent.
func (b *bench) handOff() ([]byte, error) {
	h := handoff{Servers: b.machine.servers, Failures: b.res.failures, Retries: b.res.retries}
	var err error
	if h.Cycles, err = encodeMap(b.res.cycles); err != nil {
		return nil, err
	}
	if h.Renewals, err = encodeMap(b.res.renewals); err != nil {
		return nil, err
	}
	if h.Idem, err = encodeMap(b.res.idem); err != nil {
		return nil, err
	}
	for i := range b.tables {
		t, err := encodeFields(b.tables[i].fields())
		if err != nil {
			return nil, err
		}
		h.Tables = append(h.Tables, t)
	}
	return json.Marshal(h)
}

// merge adds a handoff's figures to b's.
func (b *bench) merge(data []byte) error {
	var h handoff
	if err := json.Unmarshal(data, &h); err != nil {
		return err
	}
	if err := decodeMap(h.Cycles, b.res.cycles); err != nil {
		return err
	}
	if err := decodeMap(h.Renewals, b.res.renewals); err != nil {
		return err
	}
	if err := decodeMap(h.Idem, b.res.idem); err != nil {
		return err
	}
	for _, raw := range h.Tables {
		var t tableState
		if err := decodeFields(raw, t.fields()); err != nil {
			return err
		}
		b.tables = append(b.tables, t)
	}
	b.machine.servers = append(b.machine.servers, h.Servers...)
	b.res.failures = append(b.res.failures, h.Failures...)
	b.res.retries += h.Retries
	return nil
}
