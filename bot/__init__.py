"""review-bot: AI code review for GitHub and GitLab, scheduled by a multilevel feedback queue."""
