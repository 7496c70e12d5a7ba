package sluice

import "context"

// replyWaitKey marks a context of WaitForReply.
type replyWaitKey struct{}

// WaitForReply returns ctx marked for a call whose effect the caller must
// learn, such as a lease's chunk fetch: a store that bounds each call with
// a deadline of its own (redisstore's Timeout) waits for the reply until
// ctx's deadline instead, also when it is later. Such a store applies a
// call it has sent whether or not the reply comes in time; a caller that
// gave up on the reply would lose what the call charged.
func WaitForReply(ctx context.Context) context.Context {
	return context.WithValue(ctx, replyWaitKey{}, true)
}

// WaitsForReply reports whether ctx was marked by WaitForReply.
func WaitsForReply(ctx context.Context) bool {
	v, _ := ctx.Value(replyWaitKey{}).(bool)
	return v
}
