package consullock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/hashicorp/consul/api"
)

// txn sends ops as one transaction, as the client's KV().Txn does, and
// reports whether Consul applied it, with the results of its reads or the
// errors of the ops that failed. It goes through the client's Raw writer,
// whose error for an answer other than 200 keeps its status
// (api.StatusError): KV().Txn gives only the body for any status but 200
// and 409, and a refusal (see refusal), which applied nothing, would read
// as an outage, whose outcome is unknown.
//
// A transaction of reads alone goes through KV().Txn, whose query options
// ask for a consistent read, as Raw's writer cannot: it applies nothing
// whatever its answer.
func txn(ctx context.Context, c *api.Client, ops api.KVTxnOps) (bool, *api.KVTxnResponse, error) {
	if !slices.ContainsFunc(ops, writes) {
		ok, resp, _, err := c.KV().Txn(ops, queryOpts(ctx))
		return ok, resp, err
	}
	in := make(api.TxnOps, len(ops))
	for i, op := range ops {
		in[i] = &api.TxnOp{KV: op}
	}
	var out api.TxnResponse
	_, err := c.Raw().Write("/v1/txn", in, &out, writeOpts(ctx))
	se := api.StatusError{}
	switch {
	case errors.As(err, &se) && se.Code == http.StatusConflict:
		// Not applied: the body says which ops failed.
		if err := json.Unmarshal([]byte(se.Body), &out); err != nil {
			return false, nil, fmt.Errorf("consul: a failed transaction's answer: %w", err)
		}
	case err != nil:
		return false, nil, err
	}
	resp := &api.KVTxnResponse{Errors: out.Errors}
	for _, r := range out.Results {
		resp.Results = append(resp.Results, r.KV)
	}
	return err == nil, resp, nil
}

// writes reports whether op may change the store.
func writes(op *api.KVTxnOp) bool {
	switch op.Verb {
	case api.KVGet, api.KVGetOrEmpty, api.KVGetTree, api.KVCheckIndex, api.KVCheckNotExists, api.KVCheckSession:
		return false
	}
	return true
}
