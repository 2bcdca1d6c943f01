package dynamo

import "strings"

// Subject returns the NATS subject Dynamo publishes an endpoint-scoped
// topic on: "namespace.<ns>.component.<component>.endpoint.<endpoint>.<topic>",
// each segment escaped as Dynamo escapes it (ASCII letters, digits, '-' and
// '_' kept, every other byte as %XX).
func Subject(namespace, component, endpoint, topic string) string {
	var b strings.Builder
	b.WriteString("namespace.")
	escapeSegment(&b, namespace)
	b.WriteString(".component.")
	escapeSegment(&b, component)
	b.WriteString(".endpoint.")
	escapeSegment(&b, endpoint)
	b.WriteByte('.')
	escapeSegment(&b, topic)
	return b.String()
}

func escapeSegment(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}
