// Package httplimit is sluice's net/http middleware: it limits requests per
// client IP, per API key (hashed, never used raw) or per any function of the
// request, and answers denied requests with 429, Retry-After and the
// standard rate-limit headers.
package httplimit
