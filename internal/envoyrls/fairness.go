package envoyrls

// DefaultMaxRequestBytes bounds one request's message.
const DefaultMaxRequestBytes = 4 << 20
