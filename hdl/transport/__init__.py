"""The RC transport: responder, requester, go-back-N retransmission, and the TX packet builder."""
